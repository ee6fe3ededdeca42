"""A drain always finishes, fast, and nothing leaks (issues 26 and 32): a DEL that keeps failing is
reported to the runtime for ``deleteRetryWindow``, then answered success; the sandbox stays
recorded as unreleased (``multusd status``, ``doctor``, the metric, the journal, an Event) until
the daemon releases it by itself once the cause is gone (at its start, then on a backoff;
``multusd gc`` at once), running again only the delegates still held.

Real bridge + host-local plugins in real namespaces, the real daemon under
systemd-socket-activate, the real shim, the fake API server. Causes that never go away by
themselves: a delegate's plugin binary removed (its package was removed), a
daemon-config.json that does not parse (the daemon cannot start), a daemon that is down while
its cniDir is read-only. The window is a few seconds: the tests send DEL again, as kubelet
does, until it is answered success.
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

from harness import SHIM_ARGV, Cluster, events_bound, shim_bound, start_bound, watch_bound
from multusd.daemon import delretry
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

    wait_for(answered, WINDOW + shim_bound("DEL"), interval=0.2, what="DEL answered success")
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


def metric(port: int, name: str, **labels: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return metric_value(response.read().decode(), name, **labels)


def del_runs(port: int, plugin: str) -> int:
    """How often the daemon has run ``plugin``'s DEL."""
    return int(metric(port, "multusd_delegate_duration_seconds_count", plugin=plugin,
                      command="DEL") or 0)


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


def assert_released(cluster: Cluster, cid: str, port: int = 0) -> None:
    """Nothing of ``cid`` left: leases, records, mark, and nothing for status to show."""
    assert cluster.sandbox.leases_held() == []  # host-local's lease file is gone
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))
    results = os.path.join(cluster.daemon.cni_dir, "results")
    assert not [n for n in os.listdir(results) if f"-{cid}-" in n]
    assert not os.path.exists(mark_path(cluster, cid))
    assert not os.path.exists(os.path.join(cluster.daemon.socket_dir, MARKS, cid))
    if port:
        assert metric(port, "multusd_unreleased_sandboxes") == 0
    assert tool(cluster, "status")[1]["sandboxes"] == []


def retry_bound() -> float:
    """How long the daemon's own retry of a sandbox may take to come and end: at its start
    (which may take start_bound), or at the next step of its backoff (at most RETRY_MAX and
    half as long again), then that DEL's own deadline."""
    return (start_bound() + delretry.RETRY_MAX * (1 + delretry.RETRY_JITTER)
            + shim_bound("DEL"))


def released_by_the_daemon(cluster: Cluster, cid: str) -> None:
    """Wait for the daemon's own retries (no gc, no DEL from the runtime) to release ``cid``."""
    # the daemon says so once the records are gone: the line is part of what is waited for
    wait_for(lambda: not cluster.sandbox.leases_held() and
             not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid)) and
             f"unreleased sandbox {cid} (default/" in cluster.daemon.log(), retry_bound(),
             interval=0.1, what="the daemon to release the sandbox by itself and say so")


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
    assert [(r["network"], r["interface"]) for r in reporting["released"]] == [
        ("cluster-net", "eth0")]
    assert metric(port, "multusd_unreleased_sandboxes") == 0
    assert del_runs(port, "bridge") == 1  # the cluster network's DEL, released

    answers = del_until_answered(cluster, pod, ns_path, cid)

    assert all(a.code == 1 for a in answers[:-1]), [a.output for a in answers]
    # the drain goes on; nothing is forgotten: the records and net1's lease stay
    assert os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))
    assert len(cluster.sandbox.leases_held()) == 1  # eth0's was released, net1's is held
    failed = assert_unreleased_everywhere(cluster, port, cid, "daemon")
    assert failed["attempts"] >= 1 + len(answers)  # the daemon's own retries count too
    assert "failed to find plugin 'bridge-vendor'" in failed["failures"][0]["error"]
    # said once, by the DEL the daemon answers success, or (when the shim found the window
    # ended first, on an error the daemon sent just before) by the daemon's retry seconds later
    log = wait_for(lambda: (lambda text: text if f"DEL of sandbox {cid} (default/drained) has "
                            "failed since" in text else None)(cluster.daemon.log()),
                   retry_bound(), what="the journal's warning")
    assert "stays recorded as unreleased" in log
    # behind the attach's two AddedInterface events at most
    [event] = wait_for(lambda: cluster.events("NetworkNotReleased"), events_bound(3),
                       what="the Event")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "drained"
    assert "net1" in event["message"] and "multusd gc" in event["message"]
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0  # the runtime's DEL on remove
    # every retry, the runtime's and the daemon's own, ran only what is still held
    wait_for(lambda: "its DEL failed again" in cluster.daemon.log() or
             failed_delete(cluster, cid)["attempts"] > 2 + len(answers), retry_bound(),
             what="a retry of the daemon's own")
    assert del_runs(port, "bridge") == 1

    code, _ = tool(cluster, "gc")  # the plugin still missing: gc says so, keeps everything
    assert code == 1 and failed_delete(cluster, cid)["state"] == "unreleased"
    os.symlink(target, plugin)  # the plugin is back: the daemon releases it by itself
    released_by_the_daemon(cluster, cid)
    assert_released(cluster, cid, port)
    assert del_runs(port, "bridge") == 1 and del_runs(port, "bridge-vendor") == 1
    assert len(cluster.events("NetworkNotReleased")) == 1  # said once


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
    # the tools read the node's disk: what the shim recorded is there while the daemon is down
    code, doc = tool(cluster, "status")
    [sandbox] = [s for s in doc["sandboxes"] if s["containerId"] == cid]
    assert sandbox["failedDelete"]["state"] == "unreleased"
    assert sandbox["failedDelete"]["by"] == "shim"
    assert sandbox["failedDelete"]["attempts"] == 1 + len(answers)
    assert "recorded by the shim: multusd did not record them" in tool(
        cluster, "status", as_json=False)[1]
    code, doctor = tool(cluster, "doctor")
    [check] = [c for c in doctor["checks"] if c["name"] == "unreleased"]
    assert check["status"] == "fail" and cid in " ".join(check["details"])

    daemon.start()  # it releases the sandbox at its start, without gc

    released_by_the_daemon(cluster, cid)
    assert_released(cluster, cid, port)
    assert not cluster.events("NetworkNotReleased")  # released before anyone needed telling


def test_a_read_only_cni_dir_still_ends_the_window_and_loses_nothing(cluster):
    # the daemon is down and cniDir cannot take a mark: the shim keeps it beside the socket
    port = start(cluster)
    pod, ns_path, cid = attach(cluster, "readonly")
    daemon = cluster.daemon
    daemon.terminate()
    cni_dir = daemon.cni_dir
    # the shim runs in a private mount namespace where cniDir is read-only (gone with it)
    read_only = ["unshare", "-m", "--propagation", "private", "sh", "-ec",
                 'mount --bind -o ro "$0" "$0"; exec "$@"', cni_dir, *SHIM_ARGV]
    answers = []

    def answered() -> bool:
        answers.append(cluster.shim("DEL", pod, ns_path, cid, argv=read_only))
        return answers[-1].code == 0

    wait_for(answered, WINDOW + shim_bound("DEL"), interval=0.2, what="DEL answered success")

    assert len(answers) >= 2 and all(a.code == 1 for a in answers[:-1])
    spare = os.path.join(daemon.socket_dir, MARKS)
    assert f"cannot keep the mark of container {cid}'s failed DEL in {cni_dir}" in \
        answers[0].stderr
    assert "Read-only file system" in answers[0].stderr and spare in answers[0].stderr
    with open(os.path.join(spare, cid)) as handle:
        mark = json.load(handle)
    assert mark["by"] == "shim" and mark["attempts"] == len(answers)
    assert mark["cniDir"] == cni_dir and not os.path.exists(mark_path(cluster, cid))
    assert "has passed, so DEL answers success" in answers[-1].stderr
    assert len(cluster.sandbox.leases_held()) == 1  # nothing was released, nothing forgotten
    code, doc = tool(cluster, "status")  # read from beside the socket too
    [sandbox] = [s for s in doc["sandboxes"] if s["containerId"] == cid]
    assert sandbox["failedDelete"]["state"] == "unreleased"

    daemon.start()  # back, cniDir writable as ever: it finds the mark and releases the sandbox

    released_by_the_daemon(cluster, cid)
    assert_released(cluster, cid, port)


def test_a_pod_gone_from_the_api_does_not_shorten_the_window(cluster):
    # (before issue 32 a gone pod shortened it to 30 s: a wrong node name did so for every pod)
    plugin = vanishing(cluster, "bridge-vendor", "bridge")
    cluster.nad("vendor", "10.95.0.0/24", type="bridge-vendor")
    cluster.start(deleteRetryWindow=3600)
    pod, ns_path, cid = attach(cluster, "forced", "vendor")
    os.unlink(plugin)

    present = cluster.shim("DEL", pod, ns_path, cid)
    assert present.code == 1
    cluster.kube.delete_pod("default", "forced")  # `kubectl delete --force`: nobody waits on it
    wait_for(lambda: daemon_status(cluster)["kube"]["cachedPods"] == 0, watch_bound(),
             what="the watch to deliver the deletion")
    gone = cluster.shim("DEL", pod, ns_path, cid)

    assert gone.code == 1 and "the pod is gone from the API" not in gone.output["msg"]
    with open(mark_path(cluster, cid)) as handle:
        mark = json.load(handle)
    assert mark["until"] == mark["firstFailure"] + 3600 and "podGoneSince" not in mark


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
    os.unlink(plugin)
    del_until_answered(cluster, pod, ns_path, cid)
    config = daemonconf.load(cluster.daemon.config_path)
    retrier = delretry.DelRetrier(config, Multus(config, None),
                                  delretry.through_socket(cluster.daemon.socket_path))
    served = cluster.daemon.log().count("DEL starting CNI request")

    assert retrier.retry_all() == 0  # still failing, said by the daemon

    assert cluster.daemon.log().count("DEL starting CNI request") > served
    assert len(cluster.sandbox.leases_held()) == 1


def daemon_status(cluster: Cluster) -> dict:
    from multusd.wire import api

    response = api.http_request(cluster.daemon.socket_path, "GET", api.STATUS_ENDPOINT,
                                timeout=5)
    return json.loads(response.body)
