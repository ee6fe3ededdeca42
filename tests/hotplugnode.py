"""A node for the tests of dynamic attachments (core/reconcile, daemon/dynnetworks): the daemon's
Multus on ``stub-record`` delegates (tests/stubs), a real network namespace, a KubeClient on the
stand-in API server (NADs, pods, network-status, events), one sandbox attached by its ADD."""

from __future__ import annotations

import json
import time
import uuid

from multusd.config import daemonconf
from multusd.core import reconcile, request, sandboxconfig, scratch
from multusd.core.multus import Multus
from multusd.kube.client import KubeClient
from multusd.kube.objects import pod_from_object

from harness import STUBS, events_bound, watch_bound
from stubnode import LOG, RUNTIME_CONF, stub_calls
from testlib import wait_for

NETWORKS = "k8s.v1.cni.cncf.io/networks"
STATUS = "k8s.v1.cni.cncf.io/network-status"


def result(ifname: str, address: str) -> dict:
    """A stub's ADD result: one pod interface and its address."""
    return {"interfaces": [{"name": ifname, "sandbox": "/x"}],
            "ips": [{"address": address, "interface": 0}]}


class Node:
    """A daemon's Multus on stub delegates, with a KubeClient on the stand-in API server."""

    def __init__(self, tmp_path, kube_api, netns: str, **daemon) -> None:
        self.api, self.netns = kube_api, netns
        self.cni_dir = str(tmp_path / "cni")
        self.calls_file = str(tmp_path / "calls.jsonl")
        self.client = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
        self.client.start()
        assert self.client.wait_synced(watch_bound(), nads=True), self.client.last_error
        self.configure(**daemon)
        self.cid = uuid.uuid4().hex

    def configure(self, **daemon) -> None:
        """The daemon (re)started with daemon-config.json's keys ``daemon`` (None: unset)."""
        raw = dict({"cniDir": self.cni_dir, "binDir": STUBS,
                    "kubeconfig": self.api.kubeconfig_path, "enableDynamicNetworks": True,
                    "delegates": [self.stub("cluster", result=result("eth0", "10.0.0.2/24"))]},
                   **daemon)
        self.config = daemonconf.from_dict({k: v for k, v in raw.items() if v is not None})
        self.multus = Multus(self.config, self.client)

    def stub(self, name: str, **keys) -> dict:
        return dict({"cniVersion": "1.0.0", "name": name, "type": "stub-record",
                     "recordFile": self.calls_file}, **keys)

    def nad(self, name: str, ifname: str = "net9", address: str = "10.9.0.2/24",
            namespace: str = "default", **keys):
        self.api.add_nad(namespace, name, json.dumps(self.stub(
            name, result=result(ifname, address), **keys)))

    def attach(self, name: str = "web", networks: str = "", namespace: str = "default"):
        """The pod's sandbox ADD, as the runtime asks it."""
        meta = self.api.add_pod(namespace, name, annotations={NETWORKS: networks} if networks
                                else {})["metadata"]
        wait_for(lambda: self.client.cached_pod(namespace, name), watch_bound(),
                 what="the pod cached")
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": self.cid, "CNI_NETNS": self.netns,
               "CNI_IFNAME": "eth0", "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};"
               f"K8S_POD_NAME={name};K8S_POD_UID={meta['uid']}"}
        self.multus.cni(request.parse(env, json.dumps(RUNTIME_CONF).encode(), self.config),
                        time.monotonic() + 30, LOG)
        self.env = env

    def delete(self) -> None:
        env = dict(self.env, CNI_COMMAND="DEL")
        self.multus.cni(request.parse(env, json.dumps(RUNTIME_CONF).encode(), self.config),
                        time.monotonic() + 30, LOG)

    def pod(self, name: str = "web", namespace: str = "default"):
        return pod_from_object(self.api.pod(namespace, name))

    def select(self, networks, name: str = "web"):
        self.api.update_pod("default", name, annotations={NETWORKS: networks})
        return self.pod(name)

    def reconcile(self, pod=None, stopping=lambda: False) -> reconcile.Outcome:
        return self.multus.reconcile(pod or self.pod(), self.cid, time.monotonic() + 30, LOG,
                                     stopping)

    def calls(self) -> list:
        return stub_calls(self.calls_file)

    def scratch(self) -> bytes:
        return scratch.read_cache(scratch.cache_path(self.cni_dir, self.cid)) or b""

    def drop_record(self) -> None:
        """The sandbox as an earlier multusd (or upstream) recorded it: no configuration, no
        multusdNamedBy."""
        entries = json.loads(self.scratch())
        for entry in entries:
            entry.pop(sandboxconfig.CONFIG_KEY, None)
            entry.pop(scratch.NAMED_BY_KEY, None)
        with open(scratch.cache_path(self.cni_dir, self.cid), "w") as handle:
            json.dump(entries, handle)

    def recorded(self) -> list:
        return [(d.name, d.ifname) for d in scratch.delegates_from_cache(self.scratch())]

    def events(self, reason: str) -> list:
        return [e for e in self.api.events if e.get("reason") == reason]

    def events_bound(self) -> float:
        """How long an event this node's client queued may take to reach the API server,
        behind the others of a test here (an attach's and a reconciliation's: four at most)."""
        return events_bound(4, self.client.request_timeout)

    def status(self, name: str = "web") -> list:
        value = self.api.pod("default", name)["metadata"]["annotations"].get(STATUS)
        return [(e["name"], e.get("interface")) for e in json.loads(value)] if value else []
