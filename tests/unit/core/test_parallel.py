"""core/parallel.py: which delegates share a wave, and running a wave."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from multusd.core import parallel


def delegate(ifname: str, name: str = "", gateway_request=None, **conf) -> SimpleNamespace:
    body = {"cniVersion": "0.4.0", "name": name or ifname, "type": "bridge", **conf}
    return SimpleNamespace(ifname=ifname, name=name or ifname, gateway_request=gateway_request,
                           conf=json.dumps(body).encode())


def test_master_first_then_independent_secondaries_together():
    ds = [delegate("eth0"), delegate("net1"), delegate("net2"), delegate("net3")]
    assert parallel.plan(ds) == [[0], [1, 2, 3]]
    assert parallel.reverse_waves(parallel.plan(ds)) == [[3, 2, 1], [0]]


def test_del_releases_the_master_with_the_secondaries_that_do_not_name_it():
    ds = [delegate("eth0"), delegate("net1"), delegate("net2", master="eth0")]
    waves = parallel.plan(ds, master_first=False)
    assert waves == [[0, 1], [2]]
    assert parallel.reverse_waves(waves) == [[2], [1, 0]]
    assert parallel.plan(ds[:2], master_first=False) == [[0, 1]]
    assert parallel.plan(ds[:2]) == [[0], [1]]


def test_parallel_false_and_default_route_keep_strict_order():
    ds = [delegate("eth0"), delegate("net1"), delegate("net2")]
    assert parallel.plan(ds, parallel=False) == [[0], [1], [2]]
    ds[2].gateway_request = ("10.0.0.1",)
    assert parallel.plan(ds) == [[0], [1], [2]]


def test_dependents_come_after_what_they_name():
    ds = [delegate("eth0"), delegate("net1"), delegate("net2", master="net1"),
          delegate("net3", link="net2"), delegate("net4"), delegate("net5", master="eth0")]
    assert parallel.plan(ds) == [[0], [1, 4, 5], [2], [3]]


def test_link_in_container_in_a_conflist_and_the_auxiliary_chain_come_after_all():
    chained = {"cniVersion": "0.4.0", "name": "vl",
               "plugins": [{"type": "vlan", "master": "net9", "linkInContainer": True}]}
    ds = [delegate("eth0"), delegate("net1"),
          SimpleNamespace(ifname="net2", name="vl", gateway_request=None,
                          conf=json.dumps(chained).encode()),
          delegate("net3"), delegate("net4", name="aux")]
    assert parallel.plan(ds, auxiliary_chain="aux") == [[0], [1, 3], [2], [4]]
    passthru = {"cniVersion": "0.4.0", "name": "chain", "plugins": [{"type": "passthru"}]}
    ds[4] = SimpleNamespace(ifname="net4", name="chain", gateway_request=None,
                            conf=json.dumps(passthru).encode())
    assert parallel.plan(ds)[-1] == [4]


def bond(ifname: str, links, in_container: bool = True, **conf) -> SimpleNamespace:
    """A bond-cni style delegate enslaving ``links``."""
    return delegate(ifname, type="bond", mode="active-backup", linksInContainer=in_container,
                    links=links, **conf)


def test_a_bond_waits_for_the_links_it_enslaves():
    ds = [delegate("eth0"), delegate("net1"), delegate("net2"),
          bond("bond0", [{"name": "net1"}, {"name": "net2"}]), delegate("net4")]
    assert parallel.plan(ds) == [[0], [1, 2, 4], [3]]
    assert parallel.reverse_waves(parallel.plan(ds, master_first=False)) == [[3], [4, 2, 1, 0]]


def test_links_given_as_strings_or_on_the_host_still_order_by_name():
    # linksInContainer false: the links are host interfaces; a name that is also one of the
    # pod's attachments still orders it (waiting is never wrong, running early can be)
    ds = [delegate("eth0"), delegate("net1"), delegate("net2"),
          bond("bond0", ["net2"], in_container=False), bond("bond1", ["ens1f0"], False)]
    assert parallel.plan(ds) == [[0], [1, 2, 4], [3]]


def test_links_in_container_without_known_names_waits_for_every_earlier_delegate():
    ds = [delegate("eth0"), delegate("net1"), bond("bond0", [{"name": "sriov7"}]),
          delegate("net3")]
    assert parallel.plan(ds) == [[0], [1, 3], [2]]


def test_vlan_macvlan_ipvlan_on_a_pod_interface_wait_for_it():
    for kind in ("vlan", "macvlan", "ipvlan"):
        ds = [delegate("eth0"), delegate("net1"), delegate("net2"),
              delegate("net3", type=kind, master="net2", linkInContainer=True)]
        assert parallel.plan(ds) == [[0], [1, 2], [3]], kind


def test_the_same_fields_inside_a_conflist_plugin():
    chained = {"cniVersion": "0.4.0", "name": "bonded", "plugins": [
        {"type": "bond", "linksInContainer": True, "links": [{"name": "net1"}]},
        {"type": "tuning"}]}
    ds = [delegate("eth0"), delegate("net1"),
          SimpleNamespace(ifname="net2", name="bonded", gateway_request=None,
                          conf=json.dumps(chained).encode()),
          delegate("net3")]
    assert parallel.plan(ds) == [[0], [1, 3], [2]]
    by_name = {"cniVersion": "0.4.0", "name": "vl", "plugins": [
        {"type": "tuning"}, {"type": "vlan", "link": "net1", "vlanId": 7}]}
    ds[2] = SimpleNamespace(ifname="net2", name="vl", gateway_request=None,
                            conf=json.dumps(by_name).encode())
    assert parallel.plan(ds) == [[0], [1, 3], [2]]


def test_malformed_links_are_ignored_not_fatal():
    ds = [delegate("eth0"), delegate("net1"), bond("bond0", "net1", in_container=False),
          bond("bond1", [7, None, {"name": 3}, {}], in_container=False)]
    assert parallel.plan(ds) == [[0], [1, 2, 3]]


def test_reverse_waves_keeps_only_what_started():
    assert parallel.reverse_waves([[0], [1, 2, 3], [4]], only=[0, 1, 2, 3]) == [[3, 2, 1], [0]]


def test_run_each_runs_together_and_reports_each_outcome_in_order():
    barrier = threading.Barrier(3, timeout=10)  # fails unless three calls run at once

    def meet(value):
        barrier.wait()
        if value == 2:
            raise ValueError("boom")
        return value

    outcomes = parallel.run_each(meet, [1, 2, 3], limit=3)
    assert outcomes[0] == (1, None) and outcomes[2] == (3, None)
    assert outcomes[1][0] is None and isinstance(outcomes[1][1], ValueError)


def test_run_each_bounds_the_threads():
    running, peak, lock = [0], [0], threading.Lock()

    def call(_item):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        with lock:
            running[0] -= 1
        return threading.current_thread().name

    names = {value for value, _ in parallel.run_each(call, range(20), limit=2)}
    assert peak[0] <= 2
    assert len(names) <= 2


@pytest.mark.parametrize("raw", [{"parallelDelegates": "yes"}, {"parallelDelegates": 1}])
def test_parallel_delegates_must_be_a_boolean(raw):
    from multusd.config.daemonconf import from_dict
    from multusd.errors import ConfigError

    with pytest.raises(ConfigError, match="parallelDelegates"):
        from_dict(raw)
    # an opt-in: unset runs every delegate in order, as libcni and upstream do
    assert from_dict({}).parallel_delegates is False
    assert from_dict({"parallelDelegates": None}).parallel_delegates is False  # null = unset
    assert from_dict({"parallelDelegates": True}).parallel_delegates is True
