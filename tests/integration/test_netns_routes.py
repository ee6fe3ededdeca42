"""netns.py in real network namespaces: default-route moves (F50), interface checks, errors.

Links are veth pairs made with ``ip`` inside the test namespace (both ends stay in it), or
real bridge/host-local plugins; cached results are written with multusd.cni.resultcache first.
(The cached result's edits themselves, without privileges: tests/unit/cni/test_cni_result.py.)
"""

from __future__ import annotations

import os
import random
import socket

import pytest

from testlib import PLUGIN_DIR, netns_routes, run, unique
from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.core.defaultroute import apply_default_routes
from multusd.core.delegate import Delegate
from multusd.core.podnetworks import mark_gateway_filters
from multusd.errors import InvalidEnvironment, IOFailure, UnknownContainer
from multusd.node.netns import PodNetns


def in_pod(netns_path, method, *args):
    """One PodNetns method call in a namespace opened for it alone."""
    with PodNetns(netns_path) as pod_netns:
        return getattr(pod_netns, method)(*args)


def apply_all(netns_path, cache_dir, container_id, delegates_with_results):
    """apply_default_routes for each (delegate, result) in one opening of the namespace, as
    ADD does."""
    with PodNetns(netns_path) as netns:
        for delegate, result in delegates_with_results:
            apply_default_routes(delegate, result, netns, cache_dir, container_id)

V4_DEFAULT = {"dst": "0.0.0.0/0", "gw": "10.10.0.1"}
V6_DEFAULT = {"dst": "::/0", "gw": "fd10::1"}
OTHER_ROUTE = {"dst": "10.20.0.0/16", "gw": "10.10.0.1"}


# --- real namespaces -------------------------------------------------------------------------


def ns_name(path: str) -> str:
    return os.path.basename(path)


def default_routes(netns: str, family: str) -> list:
    return [(r.get("gateway"), r["dev"]) for r in netns_routes(netns, family)
            if r["dst"] == "default"]


@pytest.fixture
def pod(netns):
    """The namespace with eth0 (10.10.0.2/24, fd10::2/64) holding both default routes and
    net1 (10.1.1.2/24, fd01::2/64) without any: veth pairs whose peers stay inside."""
    name = ns_name(netns)
    for ifname, v4, v6 in (("eth0", "10.10.0.2/24", "fd10::2/64"),
                           ("net1", "10.1.1.2/24", "fd01::2/64")):
        run("ip", "-n", name, "link", "add", ifname, "type", "veth", "peer", "name",
            f"{ifname}p")
        for link in (ifname, f"{ifname}p"):
            run("ip", "-n", name, "link", "set", link, "up")
        run("ip", "-n", name, "addr", "add", v4, "dev", ifname)
        run("ip", "-n", name, "addr", "add", v6, "dev", ifname, "nodad")
    run("ip", "-n", name, "route", "add", "default", "via", "10.10.0.1", "dev", "eth0")
    run("ip", "-n", name, "-6", "route", "add", "default", "via", "fd10::1", "dev", "eth0")
    return netns


def delegate(name: str, ifname: str, master: bool = False, gateways=None) -> Delegate:
    conf = f'{{"cniVersion":"1.0.0","name":"{name}","type":"bridge"}}'.encode()
    return Delegate(name=name, conf=conf, ifname=ifname, master=master,
                    gateway_request=None if gateways is None else tuple(gateways))


def write_cache(cache_dir: str, container_id: str, netns: str, d: Delegate,
                result: dict) -> None:
    rt = RuntimeConf(container_id=container_id, netns=netns, ifname=d.ifname,
                     cache_dir=cache_dir)
    resultcache.write(cache_dir, d.conf_name, rt, d.conf, result)


@pytest.mark.privileged
def test_interface_exists(pod):
    assert in_pod(pod, "interface_exists", "net1") is True
    assert in_pod(pod, "interface_exists", "net9") is False


@pytest.mark.privileged
def test_delete_default_routes_removes_only_that_family(pod):
    assert in_pod(pod, "delete_default_routes", "eth0", socket.AF_INET) == 1
    assert default_routes(pod, "-4") == []
    assert default_routes(pod, "-6") == [("fd10::1", "eth0")]
    assert in_pod(pod, "delete_default_routes", "eth0", socket.AF_INET) == 0


@pytest.mark.privileged
def test_delete_on_a_missing_link_is_an_error_not_a_sweep(pod):
    with pytest.raises(IOFailure) as err:
        in_pod(pod, "delete_default_routes", "net7", socket.AF_INET)
    assert "'net7'" in err.value.msg
    assert default_routes(pod, "-4") == [("10.10.0.1", "eth0")]


@pytest.mark.privileged
def test_add_default_route_tolerates_eexist(pod):
    with PodNetns(pod) as pod_netns:
        pod_netns.delete_default_routes("eth0", socket.AF_INET)
        assert pod_netns.add_default_route("net1", "10.1.1.254") is True
        assert pod_netns.add_default_route("net1", "10.1.1.254") is False
    in_pod(pod, "add_default_route", "net1", "10.1.1.254")
    assert default_routes(pod, "-4") == [("10.1.1.254", "net1")]


@pytest.mark.privileged
def test_add_conflicting_with_another_links_default_route_is_an_error(pod):
    with pytest.raises(IOFailure) as err:
        in_pod(pod, "add_default_route", "net1", "10.1.1.254")
    assert "another default route" in err.value.msg
    assert default_routes(pod, "-4") == [("10.10.0.1", "eth0")]


@pytest.mark.privileged
def test_add_via_an_unreachable_gateway_says_why(pod):
    in_pod(pod, "delete_default_routes", "eth0", socket.AF_INET)
    with pytest.raises(IOFailure) as err:
        in_pod(pod, "add_default_route", "net1", "192.0.2.1")
    assert "subnet" in err.value.msg and "192.0.2.1" in err.value.msg


@pytest.mark.privileged
def test_apply_moves_both_default_routes_to_net1_and_updates_both_caches(pod, tmp_path):
    cache_dir, cid = str(tmp_path / "cache"), unique("c")
    eth0, net1 = mark_gateway_filters([delegate("cluster", "eth0", master=True),
                                       delegate("m", "net1", gateways=["10.1.1.254",
                                                                       "fd01::fe"])])
    eth0_result = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}],
                   "ips": [{"address": "10.10.0.2/24", "gateway": "10.10.0.1"}],
                   "routes": [V4_DEFAULT, OTHER_ROUTE, V6_DEFAULT]}
    net1_result = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1"}],
                   "ips": [{"address": "10.1.1.2/24"}]}
    write_cache(cache_dir, cid, pod, eth0, eth0_result)
    write_cache(cache_dir, cid, pod, net1, net1_result)

    apply_all(pod, cache_dir, cid, [(eth0, eth0_result),
                                                         (net1, net1_result)])

    assert default_routes(pod, "-4") == [("10.1.1.254", "net1")]
    assert default_routes(pod, "-6") == [("fd01::fe", "net1")]
    assert resultcache.read_result(cache_dir, "cluster", cid, "eth0")["routes"] == [OTHER_ROUTE]
    assert resultcache.read_result(cache_dir, "m", cid, "net1")["routes"] == [
        {"dst": "0.0.0.0/0", "gw": "10.1.1.254"}, {"dst": "::/0", "gw": "fd01::fe"}]
    assert eth0_result["routes"] == [V4_DEFAULT, OTHER_ROUTE, V6_DEFAULT], \
        "the result returned to the runtime is not modified"


@pytest.mark.privileged
def test_empty_default_route_list_removes_every_default_route(pod, tmp_path):
    cache_dir, cid = str(tmp_path / "cache"), unique("c")
    eth0, net1 = mark_gateway_filters([delegate("cluster", "eth0", master=True),
                                       delegate("m", "net1", gateways=[])])
    result = {"cniVersion": "1.0.0", "ips": [{"address": "10.10.0.2/24"}],
              "routes": [V4_DEFAULT, V6_DEFAULT]}
    write_cache(cache_dir, cid, pod, eth0, result)
    apply_all(pod, cache_dir, cid, [(eth0, result)])
    assert default_routes(pod, "-4") == [] and default_routes(pod, "-6") == []
    assert "routes" not in resultcache.read_result(cache_dir, "cluster", cid, "eth0")


@pytest.mark.privileged
def test_apply_without_a_cached_result_fails_before_touching_the_namespace(pod, tmp_path):
    eth0, _ = mark_gateway_filters([delegate("cluster", "eth0", master=True),
                                    delegate("m", "net1", gateways=["10.1.1.254"])])
    with pytest.raises(IOFailure) as err:
        apply_all(pod, str(tmp_path / "cache"), "c1",
                  [(eth0, {"cniVersion": "1.0.0", "ips": [{}]})])
    assert "error deleting default gateway in cache" in err.value.msg
    assert default_routes(pod, "-4") == [("10.10.0.1", "eth0")]


@pytest.mark.privileged
def test_apply_ignores_results_without_interfaces_and_unmarked_delegates(pod, tmp_path):
    eth0, _ = mark_gateway_filters([delegate("cluster", "eth0", master=True),
                                    delegate("m", "net1", gateways=["10.1.1.254"])])
    cache_dir = str(tmp_path / "cache")  # stays empty: neither call may need it
    apply_all(pod, cache_dir, "c1", [(eth0, {"cniVersion": "1.0.0"}),
                                     (delegate("plain", "eth0"),
                                      {"cniVersion": "1.0.0", "ips": [{}]})])
    assert default_routes(pod, "-4") == [("10.10.0.1", "eth0")]
    assert not os.path.exists(cache_dir)


@pytest.mark.privileged
def test_missing_netns_is_unknown_container_and_is_never_created(tmp_path):
    missing = f"/var/run/netns/{unique('mdgone-')}"
    for call in (lambda: in_pod(missing, "interface_exists", "eth0"),
                 lambda: in_pod(missing, "delete_default_routes", "eth0", socket.AF_INET),
                 lambda: in_pod(missing, "add_default_route", "eth0", "10.0.0.1")):
        with pytest.raises(UnknownContainer) as err:
            call()
        assert repr(missing) in err.value.msg
    assert not os.path.exists(missing)


@pytest.mark.privileged
def test_a_file_that_is_not_a_netns_is_invalid_environment(tmp_path):
    not_netns = tmp_path / "plain-file"
    not_netns.write_text("")
    with pytest.raises(InvalidEnvironment) as err:
        in_pod(str(not_netns), "interface_exists", "eth0")
    assert "not a network namespace" in err.value.msg


# --- with the real bridge and host-local plugins ---------------------------------------------


@pytest.fixture
def second_bridge():
    name = unique("mdbr")
    yield name
    run("ip", "link", "del", name, check=False)


def bridge_net(name: str, bridge: str, subnet: str, ipam_dir: str, default: bool) -> dict:
    ipam = {"type": "host-local", "subnet": f"{subnet}.0/24", "dataDir": ipam_dir}
    if default:
        ipam["routes"] = [{"dst": "0.0.0.0/0"}]
    return {"cniVersion": "1.0.0", "name": name, "type": "bridge", "bridge": bridge,
            "isGateway": True, "ipam": ipam}


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_default_route_moves_after_each_real_plugin_add(netns, bridge_name, second_bridge,
                                                        cni_state):
    """F50's black-box scenario: eth0 (bridge, default via .1) and net1 (bridge) with
    ``"default-route": [<net1 gateway>]``; after both ADDs only net1's default remains."""
    first, second = random.sample(range(200, 250), 2)
    subnet_a, subnet_b = f"10.{first}.{random.randint(0, 255)}", f"10.{second}.7"
    gateway = f"{subnet_b}.1"
    engine, cid = Engine([PLUGIN_DIR]), unique("c")
    cache_dir = cni_state["cache_dir"]
    delegates = mark_gateway_filters([
        delegate(unique("a-"), "eth0", master=True), delegate(unique("b-"), "net1",
                                                              gateways=[gateway])])
    nets = [bridge_net(delegates[0].conf_name, bridge_name, subnet_a, cni_state["ipam_dir"],
                       default=True),
            bridge_net(delegates[1].conf_name, second_bridge, subnet_b,
                       cni_state["ipam_dir"], default=False)]
    attachments = [RuntimeConf(container_id=cid, netns=netns, ifname=d.ifname,
                               cache_dir=cache_dir) for d in delegates]
    try:
        with PodNetns(netns) as pod_netns:
            for d, net, rt in zip(delegates, nets, attachments):
                result = engine.add(NetworkConfigList.load(net), rt)
                apply_default_routes(d, result, pod_netns, cache_dir, cid)
        assert default_routes(netns, "-4") == [(gateway, "net1")]
        eth0_cached = resultcache.read_result(cache_dir, delegates[0].conf_name, cid, "eth0")
        assert not [r for r in eth0_cached.get("routes", []) if r["dst"] == "0.0.0.0/0"]
        net1_cached = resultcache.read_result(cache_dir, delegates[1].conf_name, cid, "net1")
        assert net1_cached["routes"][-1] == {"dst": "0.0.0.0/0", "gw": gateway}
    finally:
        for net, rt in zip(reversed(nets), reversed(attachments)):
            engine.delete(NetworkConfigList.load(net), rt)
