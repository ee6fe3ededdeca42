"""Dynamic attachments judged by the configuration a pod was attached under, for real (issue 37,
scenario 1): the daemon under systemd-socket-activate, the real shim fed the runtime's multus
config as generate-config wrote it (the packaged auto mode, whose 00-multus.conf alone names
clusterNetwork; or an operator's static file naming its own cniDir), bridge and host-local in
real namespaces, the stand-in API server.

daemon-config.json has enableDynamicNetworks, defaultNetworks ["storage"] and namespaceIsolation:
the default network stays when the annotation gains or loses a network, another namespace's NAD
is refused with the ADD's message, and removing storage from defaultNetworks and restarting the
daemon does not strip it from the running pod; a sandbox an earlier multusd attached (no record)
is judged as configured now, said once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from harness import (Cluster, call_shim, events_bound, netns_addresses, reconcile_bound,
                     start_bound)
from multusd.core import sandboxconfig, scratch
from multusd.wire import api
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


class Node:
    """A Cluster whose runtime config is what generate-config writes (auto or static mode)."""

    def __init__(self, sandbox, kube, tmp_path, mode: str) -> None:
        self.cluster = Cluster(sandbox, kube, tmp_path)
        self.mode = mode
        self.net_d = str(tmp_path / "net.d")  # cniConfigDir: where 00-multus.conf goes
        os.makedirs(self.net_d)
        self.config: dict = {"cniConfigDir": self.net_d, "clusterNetwork": None,
                             "enableDynamicNetworks": True, "defaultNetworks": ["storage"],
                             "namespaceIsolation": True}
        if mode == "auto":
            self.config.update(multusConfigFile="auto",
                               multusAutoconfigDir=self.cluster.conf_dir)
            self.cni_dir = ""  # the daemon's own (the harness's private cniDir)
        else:  # the operator's file names clusterNetwork and cniDir; daemon-config.json neither
            self.cni_dir = str(tmp_path / "static-cni")
            static = str(tmp_path / "ops" / "multus.conf")
            os.makedirs(os.path.dirname(static))
            with open(static, "w") as handle:
                json.dump({"cniVersion": "0.4.0", "name": "multus-cni-network",
                           "type": "multus-shim", "clusterNetwork": self.cluster.cluster_path,
                           "cniDir": self.cni_dir}, handle)
            self.config.update(multusConfigFile=static, cniDir=None)
        self.cluster.nad("storage", "10.83.0.0/24", namespace="kube-system")
        self.cluster.nad("net-a", "10.81.0.0/24")
        self.cluster.nad("net-b", "10.82.0.0/24")
        self.cluster.nad("other", "10.84.0.0/24", namespace="elsewhere")

    def start(self) -> "Node":
        self.cluster.start(**self.config)
        self.cni_dir = self.cni_dir or self.cluster.daemon.cni_dir
        self.generate()
        return self

    def generate(self) -> None:
        """`multusd generate-config`, as multusd-config.service runs it."""
        proc = subprocess.run([sys.executable, "-m", "multusd", "generate-config", "--config",
                               self.cluster.daemon.config_path], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr

    def runtime_conf(self) -> dict:
        """What the runtime sends the shim: the file in cniConfigDir (the socket's directory
        added: the harness's daemon does not listen on /run/multus)."""
        name = "00-multus.conf" if self.mode == "auto" else "multus.conf"
        with open(os.path.join(self.net_d, name)) as handle:
            conf = json.load(handle)
        if self.mode == "auto":
            assert conf["clusterNetwork"] == self.cluster.cluster_path  # only here
        return dict(conf, daemonSocketDir=self.cluster.daemon.socket_dir)

    def shim(self, command: str, pod: dict, netns: str, cid: str):
        meta = pod["metadata"]
        return call_shim(command, self.runtime_conf(), container_id=cid, netns=netns,
                         pod=(meta["namespace"], meta["name"]), uid=meta["uid"])

    def restart(self, **changes) -> None:
        """Stop the daemon, edit daemon-config.json (None: remove the key), start it again."""
        daemon = self.cluster.daemon
        daemon.terminate()
        with open(daemon.config_path) as handle:
            config = json.load(handle)
        config.update(changes)
        with open(daemon.config_path, "w") as handle:
            json.dump({k: v for k, v in config.items() if v is not None}, handle)
        daemon.start()
        wait_for(lambda: api.http_request(daemon.socket_path, "GET", "/readyz",
                                          timeout=2).status == 200, start_bound(),
                 what="caches synced")
        self.generate()

    def running_pod(self, name: str, networks: str):
        pod = self.cluster.pod(name, annotations={NETWORKS_KEY: networks})
        ns_name, ns_path = self.cluster.sandbox.netns()
        cid = uuid.uuid4().hex
        add = self.shim("ADD", pod, ns_path, cid)
        assert add.code == 0, add.output
        self.cluster.kube.update_pod("default", name, phase="Running")
        return pod, ns_name, ns_path, cid

    def select(self, name: str, networks: str) -> None:
        self.cluster.kube.update_pod("default", name, annotations={NETWORKS_KEY: networks})

    def settled(self, looks: int = 0) -> dict:
        """The daemon's dynamicNetworks state once it has looked at pods ``looks`` times and
        dealt with every change it got."""
        def state():
            doc = json.loads(api.http_request(self.cluster.daemon.socket_path, "GET", "/status",
                                              timeout=5).body)["dynamicNetworks"]
            return doc if doc["pending"] == 0 and not doc["retrying"] and \
                doc["podsChecked"] >= looks else None
        return wait_for(state, reconcile_bound(), what="every pod change dealt with")


def links(ns_name: str) -> dict:
    return {k: v for k, v in netns_addresses(ns_name).items() if k != "lo"}


@pytest.fixture(params=["auto", "static"])
def node(request, sandbox, kube_api, tmp_path) -> Node:
    return Node(sandbox, kube_api, tmp_path, request.param)


def test_default_networks_and_isolation_hold_for_a_running_pod(node):
    node.start()
    pod, ns_name, ns_path, cid = node.running_pod("web", "net-a@net5")
    assert set(links(ns_name)) == {"eth0", "net1", "net5"}  # net1: defaultNetworks' storage
    assert os.path.exists(os.path.join(node.cni_dir, cid))  # the static file's cniDir

    node.select("web", "net-a@net5,net-b@net6")  # the annotation gains a network
    wait_for(lambda: "net6" in links(ns_name), reconcile_bound(), what="net6")
    node.settled()
    assert set(links(ns_name)) == {"eth0", "net1", "net5", "net6"}
    assert len(node.cluster.sandbox.leases_held()) == 4
    assert node.cluster.events("RemovedInterface") == []

    # another namespace's NAD: refused as the ADD refuses it, with its message
    node.select("web", "net-a@net5,net-b@net6,elsewhere/other@net7")
    wait_for(lambda: node.cluster.events("FailedAddingInterface"),  # behind four others
             reconcile_bound() + events_bound(5), what="the Warning")
    (event,) = node.cluster.events("FailedAddingInterface")
    assert event["type"] == "Warning"
    assert event["message"].startswith("namespace isolation enabled, annotation violates "
                                       "permission, pod is in namespace default but refers to "
                                       "target namespace elsewhere")
    other = node.cluster.pod("other", annotations={NETWORKS_KEY: "elsewhere/other@net7"})
    refused = node.shim("ADD", other, node.cluster.sandbox.netns()[1], uuid.uuid4().hex)
    assert refused.code != 0 and refused.output["msg"].endswith(": " + event["message"])
    assert node.settled()["reconciliations"]["refused"] == 1
    assert "net7" not in links(ns_name)

    # storage leaves defaultNetworks; the daemon restarts; the annotation drops net-a
    node.restart(defaultNetworks=None)
    started = [line for line in node.cluster.daemon.log().splitlines()
               if "configuration: {" in line]
    assert len(started) == 2  # logged once per start, as resolved
    assert f'"clusterNetwork": "{node.cluster.cluster_path}"' in started[-1]
    assert '"defaultNetworks": []' in started[-1] and node.cni_dir in started[-1]
    node.select("web", "net-b@net6")
    wait_for(lambda: "net5" not in links(ns_name), reconcile_bound(), what="net5 removed")
    node.settled()
    assert set(links(ns_name)) == {"eth0", "net1", "net6"}  # storage stays
    assert [e["message"] for e in node.cluster.events("RemovedInterface")] == \
        ["Remove net5 from default/net-a"]

    assert node.shim("DEL", pod, ns_path, cid).code == 0
    assert links(ns_name) == {}
    assert node.cluster.sandbox.leases_held() == []


def test_a_sandbox_an_earlier_multusd_attached_is_judged_as_configured_now(node):
    node.start()
    pod, ns_name, ns_path, cid = node.running_pod("web", "net-a@net5")
    node.settled(looks=1)  # the running pod looked at while it has its record
    path = os.path.join(node.cni_dir, cid)
    with open(path) as handle:
        entries = json.load(handle)
    for entry in entries:  # as an earlier multusd wrote it: no record
        entry.pop(sandboxconfig.CONFIG_KEY, None)
        entry.pop(scratch.NAMED_BY_KEY)
    with open(path, "w") as handle:
        json.dump(entries, handle)
    node.restart()

    node.select("web", "net-b@net6")
    wait_for(lambda: "net5" not in links(ns_name) and "net6" in links(ns_name),
             reconcile_bound(),
             what="net5 swapped for net6")
    node.select("web", "net-b@net6,net-a@net8")
    wait_for(lambda: "net8" in links(ns_name), reconcile_bound(), what="net8")
    node.settled()
    assert set(links(ns_name)) == {"eth0", "net1", "net6", "net8"}  # storage: defaultNetworks
    log = node.cluster.daemon.log()
    assert log.count(sandboxconfig.NO_RECORD % cid) == 1  # said once, not per look

    assert node.shim("DEL", pod, ns_path, cid).code == 0
    assert node.cluster.sandbox.leases_held() == []
