"""multusd.core.defaultroute: which delegates' default routes go (F50), decided before the
namespace is touched. The namespace work itself runs in real namespaces in
tests/integration/test_netns_routes.py; here the namespace path does not exist, so any
attempt to open it would fail with UnknownContainer: what these tests get instead proves
that nothing reached it."""

from __future__ import annotations

import os

import pytest

from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.core.defaultroute import apply_default_routes
from multusd.core.delegate import Delegate
from multusd.core.podnetworks import mark_gateway_filters
from multusd.errors import DecodeFailure, InvalidNetworkConfig, IOFailure
from multusd.node.netns import PodNetns

RESULT = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1", "sandbox": "/x"}],
          "ips": [{"address": "10.1.1.2/24", "interface": 0}],
          "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.1.1"}]}


def delegate(name: str, ifname: str, **fields) -> Delegate:
    return Delegate(name=name, conf=f'{{"name":"{name}","type":"bridge"}}'.encode(),
                    ifname=ifname, master=ifname == "eth0", **fields)


@pytest.fixture
def nowhere(tmp_path):
    """A PodNetns whose namespace does not exist: opening it would raise UnknownContainer."""
    with PodNetns(str(tmp_path / "no-such-netns")) as netns:
        yield netns


def cache(cache_dir: str, d: Delegate, result: dict) -> None:
    rt = RuntimeConf(container_id="c1", netns="/x", ifname=d.ifname, cache_dir=cache_dir)
    resultcache.write(cache_dir, d.conf_name, rt, d.conf, result)


def test_unmarked_delegates_and_results_without_interfaces_need_nothing(nowhere, tmp_path):
    cache_dir = str(tmp_path / "cache")  # stays empty: neither call may need it
    apply_default_routes(delegate("plain", "net1"), RESULT, nowhere, cache_dir, "c1")
    marked = delegate("m", "net1", gateway_request=("10.1.1.254",))
    apply_default_routes(marked, {"cniVersion": "1.0.0", "dns": {}}, nowhere, cache_dir, "c1")
    assert not os.path.exists(cache_dir)


def test_a_missing_cached_result_fails_before_the_namespace_is_touched(nowhere, tmp_path):
    eth0, _ = mark_gateway_filters([delegate("cluster", "eth0"),
                                    delegate("m", "net1", gateway_request=("10.1.1.254",))])
    with pytest.raises(IOFailure, match="error deleting default gateway in cache: no cached "
                                        "result for network 'cluster' interface 'eth0'"):
        apply_default_routes(eth0, RESULT, nowhere, str(tmp_path), "c1")


def test_a_gateway_that_is_not_an_address_changes_nothing(nowhere, tmp_path):
    bad = delegate("m", "net1", gateway_request=("10.1.1",))
    cache(str(tmp_path), bad, RESULT)
    with pytest.raises(InvalidNetworkConfig, match="default-route gateway '10.1.1' is not an "
                                                   "IP address; fix the pod's network"):
        apply_default_routes(bad, RESULT, nowhere, str(tmp_path), "c1")
    assert resultcache.read_result(str(tmp_path), "m", "c1", "net1") == RESULT


def test_corrupt_cached_routes_fail_before_the_namespace_is_touched(nowhere, tmp_path):
    eth0 = delegate("cluster", "eth0", filter_v4_gateway=True)
    cache(str(tmp_path), eth0, dict(RESULT, routes={"dst": "0.0.0.0/0"}))
    with pytest.raises(DecodeFailure, match="'routes' must be a list of route objects"):
        apply_default_routes(eth0, RESULT, nowhere, str(tmp_path), "c1")


def test_an_empty_gateway_counts_as_an_ipv6_one_as_upstream_counts_a_nil_ip():
    """Go reads "" and null in default-route as a nil net.IP, whose To4() is nil: upstream's
    CheckGatewayConfig counts it as an IPv6 gateway (its marks, its ECMP check)."""
    eth0, net1 = mark_gateway_filters([delegate("cluster", "eth0"),
                                       delegate("m", "net1", gateway_request=("",))])
    assert (eth0.filter_v4_gateway, eth0.filter_v6_gateway) == (True, True)
    assert (net1.filter_v4_gateway, net1.filter_v6_gateway) == (True, False)
    with pytest.raises(InvalidNetworkConfig, match="ECMP.*an empty gateway"):
        mark_gateway_filters([delegate("m", "net1", gateway_request=("",)),
                              delegate("n", "net2", gateway_request=("fd00::1",))])


def test_a_default_route_ending_with_an_empty_gateway_fails_before_the_namespace(nowhere,
                                                                                  tmp_path):
    """Upstream's SetDefaultGW fails its route via a nil gateway, and the ADD fails when it
    was the last one of the list: here too, before the namespace or the cache is touched."""
    (empty,) = mark_gateway_filters([delegate("m", "net1", gateway_request=("10.1.1.254", ""))])
    cache(str(tmp_path), empty, RESULT)
    with pytest.raises(InvalidNetworkConfig, match="error setting default gateway: the "
                                                   "default-route of network 'm' ends with an "
                                                   "empty gateway"):
        apply_default_routes(empty, RESULT, nowhere, str(tmp_path), "c1")
    assert resultcache.read_result(str(tmp_path), "m", "c1", "net1") == RESULT
