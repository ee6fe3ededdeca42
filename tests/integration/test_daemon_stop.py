"""The daemon's stop with requests that hang: it ends inside systemd's TimeoutStopSec, what it
cut is recorded, and the next daemon on the same socket serves what waited and releases it.

The real daemon on a socket held across daemons (as multusd.socket holds it), the real shim,
real bridge + host-local delegates beside ``stub-hold`` (tests/stubs), which holds a sandbox's
DEL (or ADD) for as long as a file names it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import pytest

from harness import call_shim, shim_bound, start_bound, unit_stop_timeout
from multusd.core import delmarks, markadoption
from multusd.daemon.stopping import STOP_TIMEOUT
from multusd.wire import api
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]


def pod(cid: str, name: str) -> dict:
    return {"container_id": cid, "pod": ("default", name), "uid": f"uid-{name}"}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def in_thread(call) -> tuple:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    return thread, result


def test_a_stop_cuts_what_hangs_records_it_and_the_next_daemon_releases_it(sandbox, tmp_path):
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    record = str(tmp_path / "calls.jsonl")
    vendor = {"cniVersion": "0.3.1", "name": "vendor", "type": "stub-hold",
              "holdDir": str(hold_dir), "holdOn": ["ADD", "DEL"], "recordFile": record}
    daemon = sandbox.daemon({"delegates": [sandbox.net("cluster", "10.76.0.0/24"), vendor],
                             "deleteRetryWindow": 300}, hold_socket=True)
    conf = daemon.shim_conf()
    hung_del, quick_del, hung_add = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    namespaces = {cid: sandbox.netns()[1] for cid in (hung_del, quick_del, hung_add)}
    for cid, name in ((hung_del, "hung-del"), (quick_del, "quick-del")):
        added = call_shim("ADD", conf, netns=namespaces[cid], **pod(cid, name))
        assert added.code == 0, added.output
    assert len(sandbox.leases_held()) == 2

    (hold_dir / hung_del).touch()  # its DEL hangs in the vendor plugin
    (hold_dir / hung_add).touch()  # and so does this sandbox's ADD
    first_del, first_del_out = in_thread(lambda: call_shim(
        "DEL", conf, netns=namespaces[hung_del], **pod(hung_del, "hung-del")))
    add, add_out = in_thread(lambda: call_shim(
        "ADD", conf, netns=namespaces[hung_add], **pod(hung_add, "hung-add")))
    pids = {cid: hold_dir / f"{cid}.{command}.pids"
            for cid, command in ((hung_del, "DEL"), (hung_add, "ADD"))}

    def hanging() -> bool:  # bounded by the shims' own bound; failing at once if one ended
        assert first_del.is_alive() and add.is_alive(), (first_del_out, add_out)
        return all(path.exists() for path in pids.values())

    wait_for(hanging, shim_bound("ADD"), what="the DEL and the ADD to hang in their plugin")
    plugins = [int(pid) for path in pids.values() for pid in path.read_text().split()]

    signalled = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: api.http_request(daemon.socket_path, "GET", "/readyz",
                                      timeout=5).status == 500, STOP_TIMEOUT, what="/readyz 500")
    assert api.http_request(daemon.socket_path, "GET", "/healthz", timeout=5).status == 200
    # a DEL arriving during the stop is served
    served = call_shim("DEL", conf, netns=namespaces[quick_del], **pod(quick_del, "quick-del"))
    assert served.code == 0, served.output
    assert len(sandbox.leases_held()) == 2  # quick-del's went; hung-del's and hung-add's stay
    # the kubelet's retry of the hung DEL waits behind it
    retry, retry_out = in_thread(lambda: call_shim(
        "DEL", conf, netns=namespaces[hung_del], **pod(hung_del, "hung-del")))

    # systemd SIGKILLs a stop at TimeoutStopSec: the daemon exits before, and cleanly
    assert daemon.proc.wait(unit_stop_timeout()) == 0
    stop_seconds = time.monotonic() - signalled
    for thread in (first_del, add, retry):
        thread.join(shim_bound("DEL"))  # answered by the exit at the latest
    print(f"\nstop with a hung DEL and a hung ADD: {stop_seconds:.1f}s "
          f"(budget {STOP_TIMEOUT:.0f}s, TimeoutStopSec {unit_stop_timeout():.0f}s)")
    assert "stop: 2 request(s) still running" in daemon.log()
    wait_for(lambda: not any(alive(pid) for pid in plugins), STOP_TIMEOUT,
             what="the hung plugins and their children killed")  # at the cut, before the exit

    # what was cut: the runtime was told, and it is recorded
    for out in (first_del_out[0], add_out[0], retry_out[0]):
        assert out.code == 1, out.output
    assert "was killed: multusd stopped it at its stop deadline" in first_del_out[0].output["msg"]
    assert "was killed: multusd stopped it" in add_out[0].output["msg"]
    assert "multusd is stopping" in retry_out[0].output["msg"]
    assert retry_out[0].output["code"] == 11
    mark = delmarks.read(daemon.cni_dir, hung_del)
    assert mark is not None and mark.by == "daemon", mark
    failed = {f.network: f.error for f in mark.failures}  # the first DEL's, kept by the retry's
    assert set(failed) == {"vendor", "cluster"}
    assert "was killed: multusd stopped it at its stop deadline" in failed["vendor"]
    assert "was not started: multusd stopped it" in failed["cluster"]
    assert mark.error.startswith("multusd is stopping")  # the retry's, refused at the cut
    for cid in (hung_del, hung_add):
        assert markadoption.has_records(daemon.cni_dir, cid)  # nothing forgotten
    assert len(sandbox.leases_held()) == 2

    # the cause goes away; a DEL sent while no daemon runs waits in the socket ...
    for cid in (hung_del, hung_add):
        os.unlink(hold_dir / cid)
    body = api.encode_request(dict(
        {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": hung_del, "CNI_NETNS": namespaces[hung_del],
         "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"},
        CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=hung-del;K8S_POD_UID=uid-hung-del"),
        json.dumps(conf).encode())
    queued, queued_out = in_thread(lambda: api.http_request(
        daemon.socket_path, "POST", api.CNI_ENDPOINT, body,
        timeout=start_bound() + shim_bound("DEL")))
    # ... and the next daemon on the same socket serves it and releases what was cut
    daemon.start(activate=False)
    queued.join(start_bound() + shim_bound("DEL"))
    assert queued_out and queued_out[0].status == 200, queued_out
    assert delmarks.read(daemon.cni_dir, hung_del) is None
    assert not markadoption.has_records(daemon.cni_dir, hung_del)
    deleted = call_shim("DEL", conf, netns=namespaces[hung_add], **pod(hung_add, "hung-add"))
    assert deleted.code == 0, deleted.output  # the runtime's DEL after the failed ADD
    assert not markadoption.has_records(daemon.cni_dir, hung_add)
    assert sandbox.leases_held() == []


def test_an_add_the_stop_did_not_start_is_sent_again_by_the_shim_to_the_next_daemon(
        sandbox, tmp_path):
    """The stop refuses an ADD that waited for a worker (503: not started); multusd's shim
    waits for /readyz again and the next daemon on the same socket serves it. A request that
    failed (400: the held ADD, cut) is not sent again."""
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    record = tmp_path / "calls.jsonl"
    vendor = {"cniVersion": "0.3.1", "name": "vendor", "type": "stub-hold",
              "holdDir": str(hold_dir), "holdOn": ["ADD"], "recordFile": str(record)}
    daemon = sandbox.daemon({"delegates": [sandbox.net("cluster", "10.77.0.0/24"), vendor],
                             "workers": 1}, hold_socket=True)
    conf = daemon.shim_conf()
    held, waiting = uuid.uuid4().hex, uuid.uuid4().hex
    namespaces = {cid: sandbox.netns()[1] for cid in (held, waiting)}
    (hold_dir / held).touch()  # its ADD holds the one general worker
    first, first_out = in_thread(lambda: call_shim(
        "ADD", conf, netns=namespaces[held], **pod(held, "held")))
    wait_for(lambda: (hold_dir / f"{held}.ADD.pids").exists() or not first.is_alive(),
             shim_bound("ADD"), what="the first ADD to hang in its plugin")
    assert first.is_alive(), first_out
    second, second_out = in_thread(lambda: call_shim(
        "ADD", conf, netns=namespaces[waiting], **pod(waiting, "waiting")))

    def queued() -> bool:  # past its /readyz, read, waiting for the busy worker
        assert second.is_alive(), second_out
        status = api.http_request(daemon.socket_path, "GET", api.STATUS_ENDPOINT, timeout=5)
        return json.loads(status.body)["queued"] == 1

    wait_for(queued, shim_bound("ADD"), what="the second ADD waiting for a worker")

    daemon.proc.send_signal(signal.SIGTERM)  # the cut refuses the waiting ADD, not started
    assert daemon.proc.wait(unit_stop_timeout()) == 0
    assert "stop: 1 request(s) still running after" in daemon.log()
    assert "(ADD), 1 waiting" in daemon.log()
    first.join(shim_bound("ADD"))  # answered at the cut: failed (400), not sent again
    assert first_out[0].code == 1, first_out[0].output
    assert "was killed: multusd stopped it at its stop deadline" in first_out[0].output["msg"]
    os.unlink(hold_dir / held)
    assert second.is_alive(), second_out  # waiting for a ready daemon to send it again

    daemon.start(activate=False)  # the next daemon on the same socket
    second.join(start_bound() + shim_bound("ADD"))
    assert second_out and second_out[0].code == 0, second_out
    assert second_out[0].output["ips"], second_out[0].output  # the cluster network's address
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    added = [call["container"] for call in calls if call["command"] == "ADD"]
    assert added == [held, waiting]  # each ADD ran once: the first was not resent
    for cid, name in ((held, "held"), (waiting, "waiting")):
        deleted = call_shim("DEL", conf, netns=namespaces[cid], **pod(cid, name))
        assert deleted.code == 0, deleted.output
    assert sandbox.leases_held() == []
