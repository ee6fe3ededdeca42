"""STATUS and GC that hang beside pods' ADD and DEL, through the real shim and daemon: no
request kind starves another (invariant 14), probes stay answered.

The cluster network is ``stub-hold`` (tests/stubs) at cniVersion 1.1.0: its STATUS, GC or a
sandbox's DEL hangs while a hold file says so (its node agent is stuck), and it records every
run, and every run begun while another of the same command was held. A bridge network gives
each pod a real interface beside it. The daemon has two general workers and two DEL ones.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from harness import call_shim, shim_bound
from multusd.wire import api
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

CALLS = 8  # of STATUS or GC, more than the daemon has threads: unfixed, they took them all


def pod(cid: str) -> dict:
    return {"container_id": cid, "pod": ("default", "p-" + cid[:6]), "uid": str(uuid.uuid4())}


def records(path) -> list:
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def in_threads(count: int, call) -> tuple:
    """``count`` threads each making ``call()``; (threads, their results)."""
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(call()), daemon=True)
               for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def held(path, threads: list) -> bool:
    """``path`` (a held plugin's pids file) exists; an AssertionError once every caller has
    ended without it: then nothing will hang any more."""
    if path.exists():
        return True
    assert any(thread.is_alive() for thread in threads), f"{path.name}: nothing hung"
    return False


def probes_answer(daemon) -> None:
    for endpoint in (api.HEALTH_ENDPOINT, api.READY_ENDPOINT):
        assert api.http_request(daemon.socket_path, "GET", endpoint, timeout=5).status == 200


@pytest.fixture
def node(sandbox, tmp_path):
    """(daemon, shim config, hold directory, record file) with the cluster network held on
    ``holdOn`` (STATUS, GC, DEL)."""
    def make(hold_on: list):
        hold_dir = tmp_path / "hold"
        hold_dir.mkdir()
        record = tmp_path / "calls.jsonl"
        cluster = {"cniVersion": "1.1.0", "name": "agent-net", "type": "stub-hold",
                   "holdDir": str(hold_dir), "holdOn": hold_on, "recordFile": str(record)}
        daemon = sandbox.daemon({"workers": 2, "cniVersion": "1.1.0",
                                 "delegates": [cluster, sandbox.net("pods", "10.78.0.0/24")]})
        return daemon, daemon.shim_conf("1.1.0"), hold_dir, record
    return make


def test_a_hung_status_is_not_available_in_time_and_holds_no_pods_worker(node, sandbox):
    daemon, conf, hold_dir, record = node(["STATUS", "DEL"])
    stuck, other = uuid.uuid4().hex, uuid.uuid4().hex
    netns = {cid: sandbox.netns()[1] for cid in (stuck, other)}
    for cid in (stuck, other):
        assert call_shim("ADD", conf, netns=netns[cid], **pod(cid)).code == 0
    # a DEL hung in its plugin, and the node agent stuck: STATUS hangs in it, asked again and
    # again by the runtimes
    (hold_dir / stuck).touch()
    (hold_dir / "node").touch()
    hung_del, hung_del_out = in_threads(1, lambda: call_shim("DEL", conf, netns=netns[stuck],
                                                             **pod(stuck)))
    asking, answers = in_threads(CALLS, lambda: call_shim("STATUS", conf, cni_args=""))
    wait_for(lambda: held(hold_dir / f"{stuck}.DEL.pids", hung_del), shim_bound("DEL"),
             what="the DEL to hang in its plugin")
    wait_for(lambda: held(hold_dir / "node.STATUS.pids", asking), shim_bound("STATUS"),
             what="the STATUS to hang in its plugin")

    # another pod is ADDed and DELeted, and another DEL is served, while both hang
    new = uuid.uuid4().hex
    netns[new] = sandbox.netns()[1]
    added = call_shim("ADD", conf, netns=netns[new], **pod(new))
    assert added.code == 0, added.output
    probes_answer(daemon)
    for cid in (new, other):
        deleted = call_shim("DEL", conf, netns=netns[cid], **pod(cid))
        assert deleted.code == 0, deleted.output

    for thread in asking:
        thread.join(shim_bound("STATUS"))
    assert len(answers) == CALLS
    for answer in answers:  # the daemon's answer, inside the shim's bound
        assert (answer.code, answer.output["code"]) == (1, 50), answer.output
        msg = answer.output["msg"]
        assert msg.startswith("multusd cannot serve ADD: its cluster network 'agent-net' did "
                              "not answer STATUS within "), msg
        assert "(plugin 'stub-hold' was killed)" in msg, msg
    statuses = [line for line in records(record) if line["command"] == "STATUS"]
    assert 1 <= len(statuses) <= CALLS
    assert not [line for line in statuses if "overlap" in line]  # one run at a time

    # the agent recovers: the next STATUS succeeds; the DEL's plugin lets go too
    (hold_dir / "node").unlink()
    recovered = call_shim("STATUS", conf, cni_args="")
    assert recovered.code == 0, recovered.output
    (hold_dir / stuck).unlink()
    hung_del[0].join(shim_bound("DEL"))
    assert hung_del_out[0].code == 0, hung_del_out[0].output
    assert sandbox.leases_held() == []


def test_a_hung_gc_runs_once_for_every_caller_and_never_ahead_of_pods(node, sandbox):
    daemon, conf, hold_dir, record = node(["GC"])
    before, new = uuid.uuid4().hex, uuid.uuid4().hex
    netns = {cid: sandbox.netns()[1] for cid in (before, new)}
    assert call_shim("ADD", conf, netns=netns[before], **pod(before)).code == 0
    (hold_dir / "node").touch()
    asking, answers = in_threads(CALLS, lambda: call_shim("GC", conf, cni_args=""))
    wait_for(lambda: held(hold_dir / "node.GC.pids", asking), shim_bound("GC"),
             what="the GC to hang in its plugin")

    def joined() -> bool:  # every other GC waits for the first's answer
        assert any(thread.is_alive() for thread in asking), "every GC ended"
        status = json.loads(api.http_request(daemon.socket_path, "GET", api.STATUS_ENDPOINT,
                                             timeout=5).body)
        return status["queued"] == CALLS - 1

    wait_for(joined, shim_bound("GC"), what="the other GC requests to join the first's run")
    added = call_shim("ADD", conf, netns=netns[new], **pod(new))
    assert added.code == 0, added.output
    probes_answer(daemon)
    deleted = call_shim("DEL", conf, netns=netns[before], **pod(before))
    assert deleted.code == 0, deleted.output
    assert all(thread.is_alive() for thread in asking)  # GC still hangs

    (hold_dir / "node").unlink()  # the agent recovers: the one run answers every caller
    for thread in asking:
        thread.join(shim_bound("GC"))
    assert [answer.code for answer in answers] == [0] * CALLS, [a.output for a in answers]
    assert [line for line in records(record) if line["command"] == "GC"] == [
        {"command": "GC", "container": ""}]
    assert call_shim("DEL", conf, netns=netns[new], **pod(new)).code == 0
    assert sandbox.leases_held() == []
