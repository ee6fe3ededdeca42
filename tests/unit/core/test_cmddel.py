"""multusd.core.cmddel: DEL of a sandbox and ``multusd gc --forget``, through the daemon's
Multus, on stub delegates whose records are written as ADD writes them (no namespace needed:
DEL runs without one as the spec allows)."""

from __future__ import annotations

import json
import os
import time

import pytest

from multusd import store
from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.core import delmarks, scratch, unreleased
from multusd.core.delegate import Delegate
from multusd.errors import MultusError

from stubnode import LOG, StubNode

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


@pytest.fixture
def node(tmp_path):
    return StubNode(tmp_path)


def record(node: StubNode, cid: str, *confs: dict, scratch_cache: bool = True) -> None:
    """``cid``'s records as an ADD of ``confs`` leaves them: scratch and result cache."""
    delegates = [Delegate(name=c["name"], conf=json.dumps(c).encode(),
                          ifname="eth0" if i == 0 else f"net{i}", master=i == 0)
                 for i, c in enumerate(confs)]
    if scratch_cache:
        store.atomic_write(scratch.cache_path(node.cni_dir, cid),
                           scratch.delegates_to_cache(delegates))
    for d in delegates:
        rt = RuntimeConf(container_id=cid, netns="", ifname=d.ifname, cache_dir=node.cni_dir)
        resultcache.write(node.cni_dir, d.conf_name, rt, d.conf, {"cniVersion": "1.0.0"})


def test_del_releases_every_delegate_last_first_then_drops_the_records(node):
    confs = [node.stub("cluster"), node.stub("extra"), node.stub("third")]
    node.configure(confs)
    record(node, "c1", *confs)
    node.run("DEL", "c1")
    assert node.calls() == [("DEL", "third", "net2"), ("DEL", "extra", "net1"),
                            ("DEL", "cluster", "eth0")]
    assert node.records() == []
    node.run("DEL", "c1")  # idempotent: nothing is left to release
    assert len(node.calls()) == 3


def test_without_a_scratch_cache_del_releases_what_the_result_cache_knows(node):
    confs = [node.stub("cluster"), node.stub("extra")]
    node.configure(confs)
    record(node, "c1", *confs, scratch_cache=False)
    node.run("DEL", "c1")
    assert sorted(node.calls()) == [("DEL", "cluster", "eth0"), ("DEL", "extra", "net1")]
    assert node.records() == []


def test_a_corrupt_scratch_cache_falls_back_to_the_result_cache(node):
    confs = [node.stub("cluster")]
    node.configure(confs)
    record(node, "c1", *confs)
    store.atomic_write(scratch.cache_path(node.cni_dir, "c1"), b"{not json")
    node.run("DEL", "c1")
    assert node.calls() == [("DEL", "cluster", "eth0")]
    assert node.records() == []


def test_a_failed_delete_is_reported_and_kept_until_it_succeeds(node, tmp_path):
    fixed = str(tmp_path / "fixed")
    confs = [node.stub("cluster"), node.stub("flaky", failDelUnless=fixed, error=ERROR)]
    node.configure(confs, deleteRetryWindow=300)
    record(node, "c1", *confs)
    with pytest.raises(MultusError) as err:
        node.run("DEL", "c1")
    assert err.value.msg.startswith("[ns/web/u1]: DEL failed for 1 network(s), the runtime "
                                    "will retry: flaky (net1): its daemon is down")
    assert node.calls() == [("DEL", "flaky", "net1"), ("DEL", "cluster", "eth0")]
    assert node.records() == ["c1", "results/flaky-c1-net1"]  # what is not released stays
    assert delmarks.read(node.cni_dir, "c1").attempts == 1
    open(fixed, "w").close()
    node.run("DEL", "c1")
    assert node.records() == [] and delmarks.read(node.cni_dir, "c1") is None


def test_a_missing_plugin_names_both_ways_out(node):
    confs = [node.stub("cluster"), {"cniVersion": "1.0.0", "name": "gone", "type": "no-such"}]
    node.configure(confs)
    record(node, "c1", *confs)
    with pytest.raises(MultusError) as err:
        node.run("DEL", "c1")
    assert "Plugin no-such is not installed (searched " in err.value.msg
    assert "`multusd gc --forget c1`" in err.value.msg


def test_a_netns_that_is_no_namespace_is_dropped_and_a_missing_one_passed_on(node, tmp_path):
    confs = [node.stub("cluster")]
    node.configure(confs)
    plain = tmp_path / "plain-file"
    plain.write_text("")
    record(node, "c1", *confs)
    node.run("DEL", "c1", str(plain))
    assert node.call_env(0)["CNI_NETNS"] == ""
    record(node, "c2", *confs)
    node.run("DEL", "c2", str(tmp_path / "gone"))
    assert node.call_env(1)["CNI_NETNS"] == str(tmp_path / "gone")


def test_del_without_a_container_id_runs_nothing(node):
    confs = [node.stub("cluster")]
    node.configure(confs)
    record(node, "c1", *confs)
    node.run("DEL", "")
    assert node.calls() == [] and node.records() == ["c1", "results/cluster-c1-eth0"]


def test_forget_drops_every_record_whatever_failed(node, tmp_path):
    never = str(tmp_path / "never")
    confs = [node.stub("cluster"), node.stub("stuck", failDelUnless=never, error=ERROR)]
    node.configure(confs)
    record(node, "c1", *confs)
    unreleased.record(node.cni_dir, node.request("DEL"), (), "m", window=5)
    outcome = node.multus.forget(node.request("DEL"), time.monotonic() + 30, LOG)
    assert [(d.name, why) for d, why in outcome] == [("cluster", ""),
                                                    ("stuck", "its daemon is down")]
    assert node.records() == [] and delmarks.read(node.cni_dir, "c1") is None
    assert os.listdir(os.path.join(node.cni_dir, "results")) == []


def test_a_retry_runs_only_the_delegates_still_held(node, tmp_path):
    fixed = str(tmp_path / "fixed")
    confs = [node.stub("cluster"), node.stub("extra"),
             node.stub("flaky", failDelUnless=fixed, error=ERROR)]
    node.configure(confs, deleteRetryWindow=300)
    record(node, "c1", *confs)
    with pytest.raises(MultusError):
        node.run("DEL", "c1")
    assert len(node.calls()) == 3
    mark = delmarks.read(node.cni_dir, "c1")
    assert mark.released == (delmarks.Released("cluster", "eth0"),
                             delmarks.Released("extra", "net1"))
    # the scratch cache keeps every delegate, in upstream's format, for upstream's daemon
    with open(scratch.cache_path(node.cni_dir, "c1"), "rb") as handle:
        assert [d.name for d in scratch.delegates_from_cache(handle.read())] == \
            ["cluster", "extra", "flaky"]

    with pytest.raises(MultusError):
        node.run("DEL", "c1")  # the runtime's retry

    assert node.calls()[3:] == [("DEL", "flaky", "net2")]  # the cluster network's not again
    open(fixed, "w").close()
    node.run("DEL", "c1")
    assert node.calls()[4:] == [("DEL", "flaky", "net2")]
    assert node.records() == [] and delmarks.read(node.cni_dir, "c1") is None


def test_a_mark_cni_dir_cannot_take_lands_beside_the_socket_and_the_error_stays(node, tmp_path):
    fixed = str(tmp_path / "fixed")
    confs = [node.stub("cluster"), node.stub("flaky", failDelUnless=fixed, error=ERROR)]
    node.configure(confs, deleteRetryWindow=300)
    record(node, "c1", *confs)
    (tmp_path / "cni" / ".multusd-unreleased").write_text("a file in the way")
    spare = delmarks.spare_marks_dir(node.socket_dir)

    with pytest.raises(MultusError) as err:
        node.run("DEL", "c1")

    assert err.value.msg.startswith("[ns/web/u1]: DEL failed for 1 network(s)")
    assert "This is reported until" in err.value.msg  # the window runs: the mark landed
    mark = delmarks.read(node.cni_dir, "c1", spare=spare)
    assert mark.place == spare and mark.released == (delmarks.Released("cluster", "eth0"),)
    open(fixed, "w").close()
    node.run("DEL", "c1")
    assert node.calls()[2:] == [("DEL", "flaky", "net1")]  # read from there too
    assert node.records() == [] and os.listdir(spare) == []


def test_records_that_cannot_be_removed_are_reported_as_a_failure(node):
    confs = [node.stub("cluster")]
    node.configure(confs, deleteRetryWindow=300)
    record(node, "c1", *confs, scratch_cache=False)
    os.makedirs(scratch.cache_path(node.cni_dir, "c1"))  # cannot be unlinked: a directory

    with pytest.raises(MultusError) as err:
        node.run("DEL", "c1")

    assert "DEL released every network, but its records cannot be removed" in err.value.msg
    mark = delmarks.read(node.cni_dir, "c1")
    assert mark.failures == () and mark.released == (delmarks.Released("cluster", "eth0"),)
    os.rmdir(scratch.cache_path(node.cni_dir, "c1"))
    node.run("DEL", "c1")
    assert len(node.calls()) == 1 and delmarks.read(node.cni_dir, "c1") is None


def test_a_delegate_the_result_cache_still_holds_is_run_whatever_the_mark_says(node):
    # a mark left over (the records were dropped by upstream's daemon, then the container ID
    # was added again) must not skip what the new ADD attached
    confs = [node.stub("cluster"), node.stub("extra")]
    node.configure(confs)
    record(node, "c1", *confs)
    unreleased.record(node.cni_dir, node.request("DEL"), (), "m", window=5,
                      released=(delmarks.Released("cluster", "eth0"),))
    node.run("DEL", "c1")
    assert sorted(node.calls()) == [("DEL", "cluster", "eth0"), ("DEL", "extra", "net1")]
    assert node.records() == [] and delmarks.read(node.cni_dir, "c1") is None
