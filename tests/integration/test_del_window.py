"""A drain always finishes (issue 26, item 1): a DEL that keeps failing is reported to the runtime
for ``deleteRetryWindow``, then answered success; the sandbox stays recorded as unreleased
(``multusd status``, ``doctor``, the metric, the journal, an Event) until ``multusd gc``
releases it once the cause is gone.

Real bridge + host-local plugins in real namespaces, the real daemon under
systemd-socket-activate, the real shim, the fake API server. Two causes that never go away
by themselves: a delegate's plugin binary removed (its package was removed), and a
daemon-config.json that does not parse (the daemon cannot start). The window is a few
seconds: the tests send DEL again, as kubelet does, until it is answered success.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.request
import uuid

import pytest

from harness import Cluster
from testlib import free_port, metric_value, wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"
WINDOW = 3
MARKS = ".multusd-unreleased"


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def start(cluster: Cluster, **config) -> int:
    """Start the daemon with a short window and metrics; the metrics port."""
    port = free_port()
    cluster.start(deleteRetryWindow=WINDOW, metricsPort=port, **config)
    return port


def attach(cluster: Cluster, name: str, networks: str = ""):
    pod = cluster.pod(name, annotations={NETWORKS_KEY: networks} if networks else {})
    _, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    add = cluster.shim("ADD", pod, ns_path, cid)
    assert add.code == 0, add.output
    return pod, ns_path, cid


def vanishing(cluster: Cluster, name: str, real: str) -> str:
    """``<binDir>/<name>``: the real plugin ``real`` under another name, removed by the test."""
    path = os.path.join(cluster.sandbox.bin_dir, name)
    os.symlink(os.path.realpath(os.path.join(cluster.sandbox.bin_dir, real)), path)
    return path


def del_until_answered(cluster: Cluster, pod, ns_path: str, cid: str) -> list:
    """DEL again and again, as kubelet retries StopPodSandbox, until it is answered success;
    every answer, the last one the success."""
    answers = []

    def answered() -> bool:
        answers.append(cluster.shim("DEL", pod, ns_path, cid))
        return answers[-1].code == 0

    wait_for(answered, WINDOW + 60, interval=0.2, what="DEL answered success")
    return answers


def tool(cluster: Cluster, *args: str, as_json: bool = True):
    argv = [sys.executable, "-m", "multusd", *args, "--config", cluster.daemon.config_path]
    proc = subprocess.run(argv + (["--json"] if as_json else []), capture_output=True,
                          text=True, timeout=120)
    if not as_json:
        return proc.returncode, proc.stdout
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (rc {proc.returncode}): {proc.stdout!r} "
                             f"{proc.stderr!r}") from None


def metric(port: int, name: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return metric_value(response.read().decode(), name)


def failed_delete(cluster: Cluster, cid: str) -> dict:
    code, doc = tool(cluster, "status")
    [sandbox] = [s for s in doc["sandboxes"] if s["containerId"] == cid]
    return sandbox["failedDelete"]


def mark_path(cluster: Cluster, cid: str) -> str:
    return os.path.join(cluster.daemon.cni_dir, MARKS, cid)


def assert_unreleased_everywhere(cluster: Cluster, port: int, cid: str, by: str) -> dict:
    code, doc = tool(cluster, "status")
    assert code == 1
    [sandbox] = [s for s in doc["sandboxes"] if s["containerId"] == cid]
    failed = sandbox["failedDelete"]
    assert failed["state"] == "unreleased" and failed["by"] == by, failed
    assert any(cid in p and "UNRELEASED" in p and "`multusd gc`" in p for p in doc["problems"])
    assert "UNRELEASED" in tool(cluster, "status", as_json=False)[1]
    assert "DEL:        UNRELEASED: failing since" in tool(cluster, "show", cid, "--no-api",
                                                           as_json=False)[1]
    code, doctor = tool(cluster, "doctor")
    [check] = [c for c in doctor["checks"] if c["name"] == "unreleased"]
    assert code == 1 and check["status"] == "fail" and cid in " ".join(check["details"])
    assert metric(port, "multusd_unreleased_sandboxes") == 1
    return failed


def assert_released(cluster: Cluster, port: int, cid: str) -> None:
    code, done = tool(cluster, "gc")
    assert code == 0, done
    assert [(d["containerId"], d["released"]) for d in done["unreleased"]] == [(cid, True)]
    assert cluster.sandbox.leases_held() == []  # host-local's lease file is gone
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))
    results = os.path.join(cluster.daemon.cni_dir, "results")
    assert not [n for n in os.listdir(results) if f"-{cid}-" in n]
    assert not os.path.exists(mark_path(cluster, cid))
    assert metric(port, "multusd_unreleased_sandboxes") == 0
    assert tool(cluster, "status")[1]["sandboxes"] == []


def test_a_plugin_whose_del_fails_for_good_holds_the_pod_only_for_the_window(cluster):
    # on main: every DEL fails, for ever, and the pod stays Terminating
    plugin = vanishing(cluster, "bridge-vendor", "bridge")
    cluster.nad("vendor", "10.96.0.0/24", type="bridge-vendor")
    port = start(cluster)
    pod, ns_path, cid = attach(cluster, "drained", "vendor")
    target = os.readlink(plugin)
    os.unlink(plugin)  # the package that shipped it was removed: DEL fails for good

    first = cluster.shim("DEL", pod, ns_path, cid)

    assert first.code == 1, first.output  # within the window the runtime hears it, and retries
    msg = first.output["msg"]
    assert "install bridge-vendor again" in msg and "This is reported until" in msg
    assert f"deleteRetryWindow {WINDOW}s" in msg
    marks = os.path.dirname(mark_path(cluster, cid))
    assert stat.S_IMODE(os.stat(marks).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(mark_path(cluster, cid)).st_mode) == 0o600
    reporting = failed_delete(cluster, cid)
    assert reporting["state"] == "reporting" and reporting["by"] == "daemon"
    assert reporting["until"] == reporting["firstFailure"] + WINDOW
    assert [(f["network"], f["interface"]) for f in reporting["failures"]] == [
        ("default/vendor", "net1")]
    assert metric(port, "multusd_unreleased_sandboxes") == 0

    answers = del_until_answered(cluster, pod, ns_path, cid)

    assert all(a.code == 1 for a in answers[:-1]), [a.output for a in answers]
    # the drain goes on; nothing is forgotten: the records and net1's lease stay
    assert os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))
    assert len(cluster.sandbox.leases_held()) == 1  # eth0's was released, net1's is held
    failed = assert_unreleased_everywhere(cluster, port, cid, "daemon")
    assert failed["attempts"] == 1 + len(answers)
    assert "failed to find plugin 'bridge-vendor'" in failed["failures"][0]["error"]
    log = cluster.daemon.log()
    assert f"DEL of sandbox {cid} (default/drained) has failed since" in log
    assert "stays recorded as unreleased" in log
    [event] = wait_for(lambda: cluster.events("NetworkNotReleased"), 10, what="the Event")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "drained"
    assert "net1" in event["message"] and "multusd gc" in event["message"]
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0  # the runtime's DEL on remove
    assert len(cluster.events("NetworkNotReleased")) == 1  # said once

    code, _ = tool(cluster, "gc")  # the plugin still missing: gc says so, keeps everything
    assert code == 1 and failed_delete(cluster, cid)["state"] == "unreleased"
    os.symlink(target, plugin)  # the plugin is back
    assert_released(cluster, port, cid)


def test_a_daemon_that_cannot_start_holds_the_pod_only_for_the_window(cluster):
    # on main: the shim fails every DEL while the daemon cannot start, for ever
    port = start(cluster)
    pod, ns_path, cid = attach(cluster, "typo")
    daemon = cluster.daemon
    with open(daemon.config_path) as handle:
        good = handle.read()
    daemon.terminate()
    with open(daemon.config_path, "w") as handle:
        handle.write(good.rstrip()[:-1])  # a typo: the closing brace is gone
    daemon.start(activate=False)

    first = cluster.shim("DEL", pod, ns_path, cid)

    assert first.code == 1, first.output
    with open(mark_path(cluster, cid)) as handle:
        mark = json.load(handle)
    assert mark["by"] == "shim" and mark["until"] == mark["firstFailure"] + WINDOW
    assert mark["request"]["env"]["CNI_CONTAINERID"] == cid

    answers = del_until_answered(cluster, pod, ns_path, cid)

    assert all(a.code == 1 for a in answers[:-1]), [a.output for a in answers]
    assert "has passed, so DEL answers success" in answers[-1].stderr
    assert f"DEL of container {cid} has failed since" in answers[-1].stderr
    assert len(cluster.sandbox.leases_held()) == 1  # nothing was released: it stays recorded

    daemon.terminate()
    with open(daemon.config_path, "w") as handle:
        handle.write(good)  # fixed
    daemon.start()
    failed = wait_for(lambda: "has failed since" in daemon.log() and
                      assert_unreleased_everywhere(cluster, port, cid, "shim"), 20,
                      what="the restarted daemon to announce the unreleased sandbox")
    assert failed["attempts"] == 1 + len(answers)
    assert "recorded by the shim: multusd did not record them" in tool(
        cluster, "status", as_json=False)[1]
    wait_for(lambda: cluster.events("NetworkNotReleased"), 20, what="the Event")
    assert_released(cluster, port, cid)


def test_a_pod_gone_from_the_api_is_reported_only_for_a_grace_period(cluster):
    plugin = vanishing(cluster, "bridge-vendor", "bridge")
    cluster.nad("vendor", "10.95.0.0/24", type="bridge-vendor")
    cluster.start(deleteRetryWindow=3600)
    pod, ns_path, cid = attach(cluster, "forced", "vendor")
    os.unlink(plugin)

    present = cluster.shim("DEL", pod, ns_path, cid)
    assert present.code == 1 and "the pod is gone" not in present.output["msg"]
    with open(mark_path(cluster, cid)) as handle:
        mark = json.load(handle)
    assert mark["until"] == mark["firstFailure"] + 3600

    cluster.kube.delete_pod("default", "forced")  # `kubectl delete --force`: nobody waits on it
    wait_for(lambda: daemon_status(cluster)["kube"]["cachedPods"] == 0, 10,
             what="the watch to deliver the deletion")
    gone = cluster.shim("DEL", pod, ns_path, cid)

    assert gone.code == 1 and "the pod is gone from the API" in gone.output["msg"]
    with open(mark_path(cluster, cid)) as handle:
        mark = json.load(handle)
    assert mark["podGoneSince"] == mark["lastFailure"]
    assert mark["until"] == mark["podGoneSince"] + 30  # the grace, not the hour


def test_the_daemons_own_retry_goes_through_its_socket(cluster):
    # the background retry's requests enter the daemon where the runtime's do: its lanes keep
    # one sandbox's requests one at a time
    from multusd.config import daemonconf
    from multusd.core.multus import Multus
    from multusd.daemon import delretry

    plugin = vanishing(cluster, "bridge-vendor", "bridge")
    cluster.nad("vendor", "10.94.0.0/24", type="bridge-vendor")
    start(cluster)
    pod, ns_path, cid = attach(cluster, "retried", "vendor")
    target = os.readlink(plugin)
    os.unlink(plugin)
    del_until_answered(cluster, pod, ns_path, cid)
    config = daemonconf.load(cluster.daemon.config_path)
    retrier = delretry.DelRetrier(config, Multus(config, None),
                                  delretry.through_socket(cluster.daemon.socket_path))

    assert retrier.retry_all() == 0  # still failing, said by the daemon
    served = cluster.daemon.log().count("DEL starting CNI request")
    os.symlink(target, plugin)
    assert retrier.retry_all() == 1

    assert cluster.daemon.log().count("DEL starting CNI request") == served + 1
    assert cluster.sandbox.leases_held() == []
    assert not os.path.exists(mark_path(cluster, cid))


def daemon_status(cluster: Cluster) -> dict:
    from multusd.wire import api

    response = api.http_request(cluster.daemon.socket_path, "GET", api.STATUS_ENDPOINT,
                                timeout=5)
    return json.loads(response.body)
