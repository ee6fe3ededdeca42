"""multusd.daemon.delretry: the daemon's slow background DEL of unreleased sandboxes.

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
from multusd.core import scratch, unreleased
from multusd.core.delegate import Delegate
from multusd.core.multus import Multus
from multusd.daemon.delretry import DelRetrier

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})
RUNTIME_CONF = b'{"cniVersion":"0.4.0","name":"multus-cni-network","type":"multus-shim"}'


class Node:
    """A cniDir holding one sandbox whose stub delegate fails DEL until ``self.fixed`` exists."""

    def __init__(self, tmp_path) -> None:
        self.cni_dir = str(tmp_path / "cni")
        self.fixed = str(tmp_path / "fixed")
        self.calls = str(tmp_path / "calls.jsonl")
        self.config = daemonconf.from_dict({"cniDir": self.cni_dir, "binDir": STUBS,
                                            "cniVersion": "0.4.0", "deleteRetryWindow": 5,
                                            "delegates": [self.stub()]})
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
                          (unreleased.Failure("stubnet", "eth0", "its daemon is down"),), "m",
                          window=5, pod_gone=False, now=failed_at)

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
    assert unreleased.read(node.cni_dir, "old").attempts == 2
    assert unreleased.read(node.cni_dir, "new").attempts == 1  # not the retrier's to run
    assert unreleased.read(node.cni_dir, "old").announced  # said once, in the journal

    open(node.fixed, "w").close()  # the cause is gone
    assert retrier.retry_all() == 1

    assert not os.path.exists(os.path.join(node.cni_dir, "old"))
    assert unreleased.read(node.cni_dir, "old") is None
    assert unreleased.read(node.cni_dir, "new") is not None
    assert retrier.retry_all() == 0 and node.dels() == 2


def test_start_publishes_the_window_and_announces_what_the_shim_gave_up_on(tmp_path, caplog):
    from multusd.wire import delwindow

    node = Node(tmp_path)
    store.atomic_write(os.path.join(node.cni_dir, "gaveup"), b"[]")
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "gaveup", "CNI_NETNS": "",
           "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"}
    delwindow.note_failure({"cniDir": node.cni_dir}, env, RUNTIME_CONF, "not reachable",
                           now=time.time() - 600)
    retrier = DelRetrier(node.config, node.multus, node.handle, interval=3600)

    with caplog.at_level(logging.WARNING):
        retrier.start()
        from testlib import wait_for

        wait_for(lambda: unreleased.read(node.cni_dir, "gaveup").announced,
                 what="the announcement")
        retrier.stop()

    assert delwindow.window(unreleased.mark_dir(node.cni_dir)) == 5.0
    assert any("DEL of sandbox gaveup (default/web) has failed since" in r.getMessage()
               for r in caplog.records)
    assert node.requests == []  # no DEL at start: the retries come every interval
