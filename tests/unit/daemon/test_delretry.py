"""multusd.daemon.delretry: the daemon's own DEL of unreleased sandboxes, at start and on a backoff.

The retrier is handed the daemon's request handler; here that is the same decode, parse and
dispatch to :class:`~multusd.core.multus.Multus` (no socket, no lock: one request at a time).
The delegate is the stub plugin ``stub-record``, whose DEL fails until a file exists.
"""

from __future__ import annotations

import json
import logging
import os
import time

from harness import STUBS
from multusd import store
from multusd.config import daemonconf
from multusd.core import request
from multusd.core import delmarks, scratch, unreleased
from multusd.core.delegate import Delegate
from multusd.core.multus import Multus
from multusd.daemon import delretry
from multusd.daemon.delretry import DelRetrier
from multusd.wire import delwindow
from testlib import wait_for

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})
RUNTIME_CONF = b'{"cniVersion":"0.4.0","name":"multus-cni-network","type":"multus-shim"}'


class Node:
    """A cniDir holding one sandbox whose stub delegate fails DEL until ``self.fixed`` exists.

    ``runtime_cni_dir``: the cniDir the runtime's multus config (an operator's static file)
    names besides daemon-config.json's: the node names both.
    """

    def __init__(self, tmp_path, runtime_cni_dir: str = "") -> None:
        self.cni_dir = str(tmp_path / "cni")
        self.fixed = str(tmp_path / "fixed")
        self.calls = str(tmp_path / "calls.jsonl")
        raw = {"cniDir": self.cni_dir, "binDir": STUBS, "cniVersion": "0.4.0",
               "deleteRetryWindow": 5, "socketDir": str(tmp_path / "run"),
               "delegates": [self.stub()], "cniConfigDir": str(tmp_path / "net.d")}
        if runtime_cni_dir:
            static = tmp_path / "net.d" / "static.conf"
            static.parent.mkdir()
            static.write_text(json.dumps(dict(json.loads(RUNTIME_CONF),
                                              cniDir=runtime_cni_dir)))
            raw["multusConfigFile"] = str(static)
        self.config = daemonconf.from_dict(raw)
        self.multus = Multus(self.config)
        self.requests: list = []

    def stub(self) -> dict:
        return {"cniVersion": "0.4.0", "name": "stubnet", "type": "stub-record",
                "recordFile": self.calls, "failDelUnless": self.fixed,
                "error": {"cniVersion": "0.4.0", "code": 11, "msg": "its daemon is down"}}

    def handle(self, endpoint: str, body: bytes, deadline: float, request_id: str):
        self.requests.append((endpoint, request_id))
        env, config, _ = request.decode_body(body)
        return self.multus.cni(request.parse(env, config, self.config), deadline, LOG)

    def sandbox(self, cid: str, failed_at: float) -> None:
        """Records of ``cid``, and the mark of a DEL that first failed at ``failed_at``."""
        delegate = Delegate(name="stubnet", conf=json.dumps(self.stub()).encode(),
                            ifname="eth0", master=True)
        store.atomic_write(os.path.join(self.cni_dir, cid), scratch.delegates_to_cache([delegate]))
        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": "",
               "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"}
        unreleased.record(self.cni_dir, request.parse(env, RUNTIME_CONF, self.config),
                          (delmarks.Failure("stubnet", "eth0", "its daemon is down"),), "m",
                          window=5, now=failed_at)

    def dels(self) -> int:
        if not os.path.exists(self.calls):
            return 0
        with open(self.calls) as handle:
            return sum(1 for line in handle if json.loads(line)["command"] == "DEL")


def test_unreleased_sandboxes_get_their_del_again_until_released(tmp_path):
    node = Node(tmp_path)
    node.sandbox("old", failed_at=time.time() - 60)   # unreleased
    node.sandbox("new", failed_at=time.time())        # the runtime still retries it
    retrier = DelRetrier(node.config, node.multus, node.handle)

    assert retrier.retry_all() == 0  # still failing: kept, with one more attempt

    assert node.requests == [("/cni", "unreleased-old")] and node.dels() == 1
    assert delmarks.read(node.cni_dir, "old").attempts == 2
    assert delmarks.read(node.cni_dir, "new").attempts == 1  # not the retrier's to run
    assert delmarks.read(node.cni_dir, "old").announced  # said once, in the journal

    open(node.fixed, "w").close()  # the cause is gone
    assert retrier.retry_all() == 1

    assert not os.path.exists(os.path.join(node.cni_dir, "old"))
    assert delmarks.read(node.cni_dir, "old") is None
    assert delmarks.read(node.cni_dir, "new") is not None
    assert retrier.retry_all() == 0 and node.dels() == 2


def test_at_start_the_window_is_published_and_what_the_shim_gave_up_on_is_released(tmp_path):
    node = Node(tmp_path)
    store.atomic_write(os.path.join(node.cni_dir, "gaveup"), b"[]")
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "gaveup", "CNI_NETNS": "",
           "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"}
    delwindow.note_failure({"cniDir": node.cni_dir}, env, RUNTIME_CONF, "not reachable",
                           now=time.time() - 600)
    retrier = DelRetrier(node.config, node.multus, node.handle, scan=3600)

    retrier.start()
    try:
        # at once, without waiting for a pod cache or for a retry interval
        wait_for(lambda: delmarks.read(node.cni_dir, "gaveup") is None, 10,
                 what="the shim's sandbox released at start")
    finally:
        retrier.stop()

    assert delwindow.window(os.path.join(node.cni_dir, ".multusd-unreleased")) == 5.0
    assert node.requests == [("/cni", "unreleased-gaveup")]
    assert not os.path.exists(os.path.join(node.cni_dir, "gaveup"))
    assert (retrier.retries, retrier.released) == (1, 1)


def test_marks_are_found_in_every_cni_dir_the_node_names_and_each_sandbox_where_it_is(
        tmp_path):
    # the daemon's cniDir is node.cni_dir; the runtime's static multus config names another
    # one ("runtime"), where a shim that reads only its config, finding no daemon, marked
    runtime, foreign = str(tmp_path / "runtime"), str(tmp_path / "foreign")
    node = Node(tmp_path, runtime_cni_dir=runtime)
    for directory, cid in ((node.cni_dir, "moved"), (runtime, "runtimes"), (foreign, "theirs")):
        store.atomic_write(os.path.join(directory, cid), scratch.delegates_to_cache([
            Delegate(name="stubnet", conf=json.dumps(node.stub()).encode(), ifname="eth0",
                     master=True)]))
        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": "",
               "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"}
        marked_in = foreign if directory == foreign else runtime
        assert delwindow.note_failure({"cniDir": marked_in}, env, RUNTIME_CONF,
                                      "not reachable", now=time.time() - 600) is not None
    open(node.fixed, "w").close()
    retrier = DelRetrier(node.config, node.multus, node.handle, scan=3600)

    retrier.run_due()

    assert sorted(node.requests) == [("/cni", "unreleased-moved"),
                                     ("/cni", "unreleased-runtimes")] and node.dels() == 2
    for directory, cid in ((node.cni_dir, "moved"), (runtime, "runtimes")):
        assert not os.path.exists(os.path.join(directory, cid))  # released
        assert delmarks.read(node.cni_dir, cid) is None
        assert delmarks.read(runtime, cid) is None  # nothing left behind
    assert delmarks.read(foreign, "theirs") is not None  # no cniDir the node names
    assert os.path.exists(os.path.join(foreign, "theirs"))


def test_a_mark_beside_the_socket_naming_another_cni_dir_is_retried_where_its_records_are(
        tmp_path):
    # the shim's config named a cniDir ("runtime") that could not take the mark: it went
    # beside the socket, naming that cniDir; the records are in the daemon's. It was shown,
    # and never retried (looked for in the cniDir it names alone)
    runtime = str(tmp_path / "runtime")
    node = Node(tmp_path, runtime_cni_dir=runtime)
    os.makedirs(runtime)
    (tmp_path / "runtime" / ".multusd-unreleased").write_text("in the way")
    node.sandbox("held", failed_at=time.time())
    delmarks.clear(node.cni_dir, "held")  # not the daemon's: the shim's alone
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "held", "CNI_NETNS": "",
           "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"}
    mark = delwindow.note_failure({"cniDir": runtime}, env, RUNTIME_CONF, "not reachable",
                                  now=time.time() - 600, socket_dir=str(tmp_path / "run"))
    assert mark["cniDir"] == runtime
    open(node.fixed, "w").close()
    retrier = DelRetrier(node.config, node.multus, node.handle, scan=3600)

    assert retrier.retry_all() == 1

    assert node.requests == [("/cni", "unreleased-held")]
    assert not os.path.exists(os.path.join(node.cni_dir, "held"))
    assert delmarks.read(node.cni_dir, "held", spare=retrier.spare) is None


def test_the_shims_mark_in_the_default_cni_dir_goes_once_its_sandbox_is_released(tmp_path):
    # the daemon answered the DEL with an error (its delegate failed): a shim that reads only
    # its own config's cniDir ("default") marked there too; the runtime's next DEL,
    # or something else, released the sandbox: the shim's copy must not stay for ever
    default = str(tmp_path / "default")
    node = Node(tmp_path, runtime_cni_dir=default)
    for cid in ("released", "forgotten", "held"):
        node.sandbox(cid, failed_at=time.time())
        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": "",
               "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"}
        assert delwindow.note_failure({"cniDir": default}, env, RUNTIME_CONF, "its daemon is "
                                      "down", now=time.time()) is not None
    retrier = DelRetrier(node.config, node.multus, node.handle, scan=3600)
    open(node.fixed, "w").close()
    node.multus.cni(request.parse(dict(env, CNI_CONTAINERID="released"), RUNTIME_CONF,
                                  node.config), time.monotonic() + 30, LOG)
    assert delmarks.read(node.cni_dir, "released") is None  # the daemon's own: dropped

    retrier.after_del("released")  # as the daemon does once it answered that DEL

    assert delmarks.read(default, "released") is None
    assert delmarks.read(default, "forgotten") is not None  # not that DEL's
    retrier.after_del("held")  # answered success, yet not released (its window is over)
    assert delmarks.read(default, "held") is not None
    os.unlink(os.path.join(node.cni_dir, "forgotten"))  # e.g. `gc --forget` with no daemon

    retrier.run_due()  # the next look (nothing is due: every window still runs)

    assert delmarks.read(default, "forgotten") is None
    assert delmarks.read(default, "held") is None  # taken in: the daemon keeps its own
    assert delmarks.read(node.cni_dir, "held").by == "daemon"
    retrier.after_del("no-such")  # nothing marked: nothing to do, never raises


def test_a_sandbox_still_failing_is_retried_on_a_backoff_and_announced_once(tmp_path, caplog):
    node = Node(tmp_path)
    node.sandbox("old", failed_at=time.time() - 60)
    retrier = DelRetrier(node.config, node.multus, node.handle, first=0.2, cap=0.8,
                         scan=3600)

    with caplog.at_level(logging.WARNING):
        pause = retrier.run_due()  # new: at once

    assert node.dels() == 1 and 0 < pause <= 0.3  # the first step, not the scan
    assert retrier.run_due() > 0 and node.dels() == 1  # not due yet: nothing runs
    wait_for(lambda: retrier.run_due() and node.dels() == 2, 5, interval=0.05,
             what="the second retry")
    announced = [r for r in caplog.records if "DEL of sandbox old" in r.getMessage()]
    assert len(announced) == 1 and delmarks.read(node.cni_dir, "old").announced
    open(node.fixed, "w").close()  # the cause is gone
    wait_for(lambda: retrier.run_due() and delmarks.read(node.cni_dir, "old") is None, 5,
             interval=0.05, what="the release")
    assert node.dels() == 3 and retrier.run_due() == 3600 and node.dels() == 3


def test_a_window_ending_is_when_the_daemon_looks_again(tmp_path):
    node = Node(tmp_path)
    node.sandbox("new", failed_at=time.time())  # window of 5 s: the runtime retries it
    retrier = DelRetrier(node.config, node.multus, node.handle, scan=3600)

    pause = retrier.run_due()

    assert node.requests == [] and 0 < pause <= 6  # its end (+1 s), not the scan


def test_the_backoff_doubles_to_its_cap_each_wait_up_to_half_again_under_a_minute(tmp_path):
    backoff = DelRetrier(Node(tmp_path).config, None, None).curve.delays()
    waits = [backoff.next() for _ in range(9)]
    steps = [5, 10, 20, 40, 40, 40, 40, 40, 40]
    assert all(step <= wait < 1.5 * step for wait, step in zip(waits, steps)), waits
    assert max(waits) < 60  # released within a minute of its cause going away
