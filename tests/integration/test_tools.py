"""The operator tools (multusd status, show, doctor, gc) against a real node's records.

Pods are attached by the real shim and daemon with real plugins and the fake API server; the
tools then run as the operator would run them, as ``python -m multusd`` processes, with the
daemon running and stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from harness import Cluster, REPO, netns_addresses, start_bound
from testlib import run, wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"
STATUS_KEY = "k8s.v1.cni.cncf.io/network-status"
RBAC = os.path.join(REPO, "packaging", "rbac.yaml")


class Node:
    """A cluster whose daemon config also generates 00-multus.conf, plus the tools to run."""

    def __init__(self, sandbox, kube, tmp_path) -> None:
        self.cluster = Cluster(sandbox, kube, tmp_path)
        self.ready_file = str(tmp_path / "default-network-ready")
        with open(self.ready_file, "w") as handle:
            handle.write("ok\n")
        self.kube = kube
        self.attached: dict = {}

    def start(self, **config) -> "Node":
        conf_dir = self.cluster.conf_dir
        config = {"cniConfigDir": conf_dir, "multusAutoconfigDir": conf_dir,
                  "readinessindicatorfile": self.ready_file, **config}
        self.cluster.start(**config)
        os.chmod(self.daemon.socket_path, 0o600)  # what SocketMode=0600 gives under systemd
        proc = self.tool("generate-config", json_out=False)
        assert proc.returncode == 0, proc.stderr
        return self

    @property
    def daemon(self):
        return self.cluster.daemon

    @property
    def multus_conf(self) -> str:
        return os.path.join(self.cluster.conf_dir, "00-multus.conf")

    def tool(self, *args: str, json_out: bool = True) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "multusd", *args, "--config", self.daemon.config_path]
        if json_out:
            argv.append("--json")
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def tool_json(self, *args: str) -> tuple:
        proc = self.tool(*args)
        try:
            return proc.returncode, json.loads(proc.stdout)
        except ValueError:
            raise AssertionError(f"not JSON (rc {proc.returncode}): {proc.stdout!r} "
                                 f"{proc.stderr!r}") from None

    def attach(self, name: str, networks: str = "") -> tuple:
        annotations = {NETWORKS_KEY: networks} if networks else {}
        pod = self.cluster.pod(name, annotations=annotations)
        ns_name, ns_path = self.cluster.sandbox.netns()
        cid = uuid.uuid4().hex
        add = self.cluster.shim("ADD", pod, ns_path, cid)
        assert add.code == 0, add.output
        self.attached[name] = (pod, ns_name, ns_path, cid)
        return pod, ns_name, ns_path, cid

    def files(self) -> list:
        found = []
        for directory, _, names in os.walk(self.daemon.cni_dir):
            found += [os.path.join(directory, n) for n in names]
        return sorted(found)


@pytest.fixture
def node(sandbox, kube_api, tmp_path) -> Node:
    return Node(sandbox, kube_api, tmp_path)


def pod_links(ns_name: str) -> dict:
    """ifname -> (ipv4 addresses, mac) as ``ip -n`` shows them."""
    addresses = netns_addresses(ns_name)
    links = json.loads(run("ip", "-n", ns_name, "-j", "link", "show").stdout)
    return {link["ifname"]: (addresses.get(link["ifname"], []), link.get("address", ""))
            for link in links if link["ifname"] != "lo"}


def checks(doc: dict) -> dict:
    return {c["name"]: c for c in doc["checks"]}


# --- status and show -------------------------------------------------------------------------


def test_status_and_show_match_the_pods_namespaces_running_and_stopped(node):
    node.cluster.nad("net-a", "10.81.0.0/24")
    node.cluster.nad("net-b", "10.82.0.0/24")
    node.start()
    wanted = {"one": "", "two": "net-a", "three": "net-a,net-b"}
    for name, networks in wanted.items():
        node.attach(name, networks)

    code, running = node.tool_json("status")
    assert code == 0, running["problems"]
    assert running["daemon"]["running"] is True
    assert running["daemon"]["version"]
    assert running["daemon"]["requests"]["ok"] == 3
    assert running["node"] == {"name": node.kube.node,
                               "source": "nodeName in daemon-config.json"}
    assert running["multusConf"]["state"] == "current"
    assert running["api"]["synced"] is True
    by_pod = {s["pod"]["name"]: s for s in running["sandboxes"]}
    assert set(by_pod) == set(wanted)
    for name, (_, ns_name, ns_path, cid) in node.attached.items():
        record = by_pod[name]
        assert record["containerId"] == cid and record["netns"] == ns_path
        assert record["netnsState"] == "present"
        links = pod_links(ns_name)
        assert {a["interface"]: (a["ips"], a["mac"]) for a in record["attachments"]} == links
    assert [a["network"] for a in by_pod["three"]["attachments"]] == [
        "cluster-net", "default/net-a", "default/net-b"]
    assert len(by_pod["one"]["attachments"]) == 1

    from multusd.wire import api  # the daemon's own read-only endpoint behind it

    assert api.http_request(node.daemon.socket_path, "POST", "/status").status == 405
    human = node.tool("status", json_out=False)
    assert human.returncode == 0, human.stdout
    assert "daemon:     running" in human.stdout
    cid3 = node.attached["three"][3]
    line = next(l for l in human.stdout.splitlines() if l.startswith("default/three"))
    assert cid3[:12] in line and "net2=default/net-b(10.82.0.2/24)" in line

    node.daemon.terminate()
    code, stopped = node.tool_json("status")
    assert code == 1  # nothing serves the shim: that needs the operator
    assert stopped["daemon"]["running"] is False
    assert any("not running" in p for p in stopped["problems"])
    assert stopped["sandboxes"] == running["sandboxes"]

    # show, with the daemon stopped, by pod and by container ID prefix
    _, ns_name, ns_path, cid = node.attached["three"]
    code, shown = node.tool_json("show", "default/three")
    assert code == 0, shown["api"]
    assert shown["containerId"] == cid and shown["pod"]["uid"]
    assert {a["interface"]: (a["ips"], a["mac"]) for a in shown["attachments"]} == \
        pod_links(ns_name)
    assert shown["attachments"][1]["config"]["type"] == "bridge"
    assert shown["attachments"][1]["result"]["ips"][0]["address"] == \
        pod_links(ns_name)["net1"][0][0]
    assert all(os.path.exists(a["resultFile"]) for a in shown["attachments"])
    assert shown["api"]["state"] == "agree"
    code, by_id = node.tool_json("show", cid[:10])
    assert code == 0 and by_id["containerId"] == cid
    text = node.tool("show", "three", json_out=False)
    assert text.returncode == 0
    assert "network-status agrees" in text.stdout and "net2: network default/net-b" in text.stdout
    missing = node.tool("show", "default/nobody", json_out=False)
    assert missing.returncode == 3 and "no sandbox" in missing.stderr


def test_show_says_when_network_status_disagrees_with_the_node(node):
    node.cluster.nad("net-a", "10.81.0.0/24")
    node.start()
    node.attach("web", "net-a")
    status = node.cluster.status("default", "web")
    status[1]["ips"] = ["10.81.0.99"]
    node.kube.update_pod("default", "web", annotations={STATUS_KEY: json.dumps(status)})

    code, shown = node.tool_json("show", "default/web")

    assert code == 1
    assert shown["api"]["state"] == "disagree"
    assert shown["api"]["differences"] == [
        "default/net-a (net1): network-status has IPs ['10.81.0.99'], the node ['10.81.0.2']"]
    assert "DISAGREES" in node.tool("show", "web", json_out=False).stdout


def test_show_redacts_credentials_in_the_delegate_config(node):
    node.cluster.nad("net-s", "10.85.0.0/24", password="hunter2-secret", apiToken="t0ken-x")
    node.start()
    node.attach("secret", "net-s")
    proc = node.tool("show", "default/secret")
    assert proc.returncode == 0
    assert "hunter2-secret" not in proc.stdout and "t0ken-x" not in proc.stdout
    conf = json.loads(proc.stdout)["attachments"][1]["config"]
    assert conf["password"] == "<redacted>" and conf["apiToken"] == "<redacted>"


# --- doctor ----------------------------------------------------------------------------------


def test_doctor_all_green_exits_0(node):
    node.cluster.nad("net-a", "10.81.0.0/24")
    node.start()
    node.attach("web", "net-a")

    code, doc = node.tool_json("doctor", "--rbac", RBAC)

    assert code == 0, [(c["name"], c["verdict"]) for c in doc["checks"] if c["status"] == "fail"]
    by_name = checks(doc)
    assert by_name["permissions"]["status"] == "ok"
    assert "all 8 permissions" in by_name["permissions"]["verdict"]
    assert by_name["nad-api"]["status"] == by_name["dra"]["status"] == "ok"
    assert by_name["plugins"]["status"] == "ok"
    assert "bridge" in by_name["plugins"]["verdict"] and "host-local" in \
        by_name["plugins"]["verdict"]
    assert by_name["node"]["status"] == by_name["00-multus.conf"]["status"] == "ok"
    human = node.tool("doctor", "--rbac", RBAC, json_out=False)
    assert human.returncode == 0 and "all checks passed" in human.stdout


def _break_plugin(node):
    conf = {"cniVersion": "0.4.0", "type": "nosuch-plugin"}
    node.kube.add_nad("default", "broken", json.dumps(conf))
    node.cluster.pod("needs-broken", annotations={NETWORKS_KEY: "broken"})


def _wrong_node(node):
    config = dict(node.daemon.config, nodeName="not-this-node")
    with open(node.daemon.config_path, "w") as handle:
        json.dump(config, handle)


def _empty_conf(node):
    open(node.multus_conf, "w").close()


BREAKAGES = {
    "missing-plugin": (_break_plugin, "plugins", "nosuch-plugin", "install them"),
    "wrong-node": (_wrong_node, "node", "not-this-node", "nodeName"),
    "unreachable-api": (lambda n: n.kube.stop(), "api", "unreachable", "reachable"),
    "permission-denied": (lambda n: n.kube.deny("update", "pods/status"), "permissions",
                          "update pods/status", "kubelet.conf"),
    "nad-permission-denied": (
        lambda n: n.kube.deny("list", "network-attachment-definitions", "k8s.cni.cncf.io"),
        "permissions", "list network-attachment-definitions.k8s.cni.cncf.io",
        "kubectl apply -f"),
    "nad-crd-missing": (lambda n: setattr(n.kube, "nad_crd_installed", False), "nad-api",
                        "crd-missing", "network-attachment-definition-crd.yaml"),
    "empty-conf": (_empty_conf, "00-multus.conf", "empty", "multusd generate-config"),
    "missing-conf": (lambda n: os.unlink(n.multus_conf), "00-multus.conf", "missing",
                     "multusd generate-config"),
    "socket-mode": (lambda n: os.chmod(n.daemon.socket_path, 0o666), "socket", "0666",
                    "SocketMode=0600"),
    "daemon-down": (lambda n: n.daemon.terminate(), "service", "does not answer /healthz",
                    "journalctl -u multusd.service"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_doctor_names_each_failure_and_its_fix(node, breakage):
    node.start()
    node.attach("web")
    assert node.tool_json("doctor", "--rbac", RBAC)[0] == 0  # green before the breakage
    apply, name, evidence, fix = BREAKAGES[breakage]
    apply(node)

    code, doc = node.tool_json("doctor", "--rbac", RBAC)

    assert code == 1
    check = checks(doc)[name]
    assert check["status"] == "fail", check
    assert evidence in check["verdict"] + " ".join(check["details"]), check
    assert fix in check["fix"], check
    failed = [c["name"] for c in doc["checks"] if c["status"] == "fail"]
    assert failed[0] == name, failed  # the first failure is the cause itself
    human = node.tool("doctor", "--rbac", RBAC, json_out=False)
    assert human.returncode == 1
    assert f"FAIL  {name}" in human.stdout and f"fix: {check['fix']}" in human.stdout


def test_permission_denied_reaches_the_daemon_as_403(node, kube_api):
    """The API stand-in's deny() is real RBAC for the client, not only for reviews."""
    from multusd.errors import MultusError
    from multusd.kube.access import ApiProbe

    kube_api.deny("list", "pods")
    probe = ApiProbe(kube_api.kubeconfig_path, kube_api.node)
    assert probe.can("list", "", "pods")[0] is False
    assert probe.can("get", "", "pods")[0] is True
    with pytest.raises(MultusError, match="403 Forbidden"):
        probe.pods_on_node()


def test_doctor_dra_check_names_the_pods_with_claims_when_dra_reads_are_denied(node):
    node.start()
    node.cluster.pod("gpu-user", status={"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": "gpu-user-gpu-abc"}]})
    node.kube.deny("list", "resourceslices", group="resource.k8s.io")

    code, doc = node.tool_json("doctor", "--rbac", RBAC)

    assert code == 1
    dra = checks(doc)["dra"]
    assert dra["status"] == "fail", dra
    assert "1 pod(s) on this node hold claims" in dra["verdict"]
    assert dra["details"] == ["list resourceslices.resource.k8s.io: denied by the fake API "
                              "server's deny() list", "default/gpu-user"]
    assert f"kubectl apply -f {RBAC}" in dra["fix"]
    # the pod permissions are fine: only the DRA check fails, naming the DRA reads
    assert checks(doc)["permissions"]["status"] == "ok"


def test_doctor_dra_check_skips_a_server_without_dra(node, kube_api):
    node.start()
    kube_api.serve_dra = False
    code, doc = node.tool_json("doctor", "--rbac", RBAC)
    assert code == 0
    assert checks(doc)["dra"]["status"] == "skip"
    assert "does not serve resource.k8s.io/v1" in checks(doc)["dra"]["verdict"]


# --- gc --------------------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["daemon", "in-process"])
def test_gc_lists_then_releases_only_sandboxes_whose_netns_is_gone(node, via):
    node.cluster.nad("net-a", "10.81.0.0/24")
    node.start()
    _, gone_ns, gone_path, gone_cid = node.attach("gone", "net-a")
    _, live_ns, live_path, live_cid = node.attach("live", "net-a")
    live_links = pod_links(live_ns)
    run("ip", "netns", "del", gone_ns)
    files, leases = node.files(), sorted(node.cluster.sandbox.leases_held())
    assert len(leases) == 4

    for args in (("gc",), ("gc", "--dry-run")):
        code, listed = node.tool_json(*args)
        assert code == 0 and listed["dryRun"] is True
        assert [s["containerId"] for s in listed["stale"]] == [gone_cid]
        assert listed["stale"][0]["netns"] == gone_path
        assert node.files() == files and sorted(node.cluster.sandbox.leases_held()) == leases
    text = node.tool("gc", json_out=False).stdout
    assert "multusd gc --release" in text and gone_cid in text
    code, doc = node.tool_json("doctor", "--rbac", RBAC)
    assert code == 1 and checks(doc)["stale"]["status"] == "fail"
    assert "multusd gc --release" in checks(doc)["stale"]["fix"]

    if via == "in-process":
        node.daemon.terminate()
    code, released = node.tool_json("gc", "--release")

    assert code == 0, released
    assert released["via"] == via and released["released"] == 1
    assert not any(gone_cid in f for f in node.files())
    assert [f for f in node.files() if live_cid in f] == [f for f in files if live_cid in f]
    assert len(node.cluster.sandbox.leases_held()) == 2
    assert pod_links(live_ns) == live_links
    assert node.tool_json("gc")[1]["stale"] == []
    assert [s["containerId"] for s in node.tool_json("status")[1]["sandboxes"]] == [live_cid]


def test_count_stale_sandboxes_for_the_metric(node):
    from multusd.core.records import count_stale_sandboxes

    node.start()
    _, ns_name, _, _ = node.attach("web")
    assert count_stale_sandboxes(node.daemon.cni_dir) == 0
    run("ip", "netns", "del", ns_name)
    assert count_stale_sandboxes(node.daemon.cni_dir) == 1
    assert count_stale_sandboxes(os.path.join(node.daemon.cni_dir, "absent")) == 0


def test_status_names_the_node_as_the_daemon_resolves_it_running_and_stopped(node):
    node.start(nodeName=None, env={"MULTUS_NODE_NAME": node.kube.node})
    code, running = node.tool_json("status")
    assert running["node"] == {"name": node.kube.node, "source": "MULTUS_NODE_NAME"}
    node.daemon.terminate()
    env = dict(os.environ, MULTUS_NODE_NAME=node.kube.node)  # as a drop-in would give it
    proc = subprocess.run([sys.executable, "-m", "multusd", "status", "--config",
                           node.daemon.config_path, "--json"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert json.loads(proc.stdout)["node"] == {"name": node.kube.node,
                                               "source": "MULTUS_NODE_NAME"}


def test_status_names_a_missing_nad_crd_and_its_fix(node):
    node.kube.nad_crd_installed = False
    node.start()
    node.attach("plain")  # pods without NADs are served meanwhile
    # the NAD cache's first list fails: a part of the daemon's start
    wait_for(lambda: node.tool_json("status")[1]["api"].get("nadProblem"), start_bound(),
             what="the NAD condition in status")
    code, doc = node.tool_json("status")
    assert code == 1 and doc["api"]["nadProblem"]["condition"] == "crd-missing"
    assert any("network-attachment-definition-crd.yaml" in p for p in doc["problems"])
    assert "NAD API crd-missing" in doc["api"]["summary"]
    human = node.tool("status", json_out=False)
    assert "kubectl apply -f /usr/share/multusd/network-attachment-definition-crd.yaml" in \
        human.stdout + human.stderr
