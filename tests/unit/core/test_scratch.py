"""multusd.core.scratch: the scratch cache <cniDir>/<containerID> in upstream's exact format,
read back from ours and from upstream's (v4.3's lossy conflists included)."""

from __future__ import annotations

import base64
import json
import os

import pytest

from multusd.core.podnetworks import build_delegates
from multusd.core.scratch import (NAMED_BY_KEY, cache_path, delegates_from_cache,
                                  delegates_to_cache, read_cache)
from multusd.core.settings import load_settings
from multusd.errors import DecodeFailure, IOFailure
from multusd.store.valueclass import replace

from nads import BRIDGE, MACVLAN, Nad, Nads, write

NETWORKS = "k8s.v1.cni.cncf.io/networks"


def build(netconf, annotations, nads):
    """The delegates resolution gives a pod in namespace "test" (what ADD records)."""
    return build_delegates(load_settings(netconf), pod_namespace="test", pod_name="mypod",
                           annotations=annotations, cni_ifname="eth0", get_nad=nads)


def summary(delegates):
    return [(d.name, d.ifname, d.master) for d in delegates]


@pytest.fixture
def cluster(conf_dir):
    write(f"{conf_dir}/10-b.conf", BRIDGE)
    return {"clusterNetwork": "cbr0", "confDir": conf_dir}


# What upstream's json.Marshal([]*DelegateNetConf) writes for the delegates built in
# test_cache_matches_upstream_bytes (derived from the Go struct tags and PluginConf.MarshalJSON).
EMPTY_LIST = ('"CNINetworkConfigList":{"Name":"","CNIVersion":"","DisableCheck":false,'
              '"DisableGC":false,"LoadOnlyInlinedPlugins":false,"Plugins":null,"Bytes":null},')
UPSTREAM_CACHE = (
    '[{"Conf":{"cniVersion":"0.3.1","ipam":{"type":"host-local"},"name":"cbr0","type":"bridge"},'
    '"ConfList":{},' + EMPTY_LIST + '"Name":"cbr0","IsFilterV4Gateway":true,'
    '"IsFilterV6Gateway":true,"Bytes":"%s"},'
    '{"Conf":{"capabilities":{"mac":true},"cniVersion":"0.3.1","ipam":{},"name":"net1",'
    '"type":"macvlan"},"ConfList":{},' + EMPTY_LIST + '"Name":"test/net1","ifnameRequest":"if1",'
    '"macRequest":"c2:11:22:33:44:55","ipRequest":["10.1.1.5/24"],'
    '"default-route":["10.1.1.254"],"IsFilterV4Gateway":false,"IsFilterV6Gateway":true,'
    '"Bytes":"%s"}]')


def test_cache_matches_upstream_bytes(tmp_path):
    primary = write(tmp_path / "10-b.conf", BRIDGE)
    nads = Nads(Nad("test", "net1", MACVLAN))
    delegates = build({"clusterNetwork": primary}, {NETWORKS: (
        '[{"name":"net1","interface":"if1","mac":"c2:11:22:33:44:55",'
        '"ips":["10.1.1.5/24"],"default-route":["10.1.1.254"]}]')}, nads)
    expected = UPSTREAM_CACHE % (base64.b64encode(open(primary, "rb").read()).decode(),
                                 base64.b64encode(MACVLAN.encode()).decode())
    assert delegates_to_cache([replace(d, named_by="") for d in delegates]).decode() == expected
    # and what named each delegate, last, in a key no field of upstream's DelegateNetConf has
    ours = json.loads(delegates_to_cache(delegates))
    assert [(list(e)[-1], e[NAMED_BY_KEY]) for e in ours] == [
        (NAMED_BY_KEY, "clusterNetwork"), (NAMED_BY_KEY, "k8s.v1.cni.cncf.io/networks")]
    assert [{k: v for k, v in e.items() if k != NAMED_BY_KEY} for e in ours] == \
        json.loads(expected)
    assert [d.named_by for d in delegates_from_cache(delegates_to_cache(delegates))] == \
        ["clusterNetwork", "k8s.v1.cni.cncf.io/networks"]


def test_an_upstream_v43_conflist_from_a_file_is_read_from_what_it_executed():
    """v4.3 records a clusterNetwork "*.conflist" with lossy Bytes (only PluginConf's keys)
    and the plugins it ran in CNINetworkConfigList: DEL must run those."""
    import upstreamfmt  # tests/: upstream's format from its Go types

    raw = {"cniVersion": "0.4.0", "name": "k8s-pod-network", "plugins": [
        {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local",
                                                      "subnet": "10.1.0.0/16"}},
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}]}
    conf = json.dumps(raw).encode()
    entry = upstreamfmt.delegate_entry(conf, "k8s-pod-network", from_file_conflist=True)
    assert "subnet" not in base64.b64decode(entry["Bytes"]).decode()  # what v4.3 wrote
    (delegate,) = delegates_from_cache(upstreamfmt.scratch_cache([entry]))
    assert json.loads(delegate.conf) == raw
    assert delegate.master and delegate.name == "k8s-pod-network"


def test_cache_round_trip_keeps_what_del_needs(cluster):
    nads = Nads(Nad("test", "net1", MACVLAN))
    delegates = build(cluster, {NETWORKS: '[{"name":"net1","interface":"if1",'
                                          '"mac":"c2:11:22:33:44:55","default-route":[],'
                                          '"portMappings":[{"hostPort":1,"containerPort":1}]}]'},
                      nads)
    loaded = delegates_from_cache(delegates_to_cache(delegates), top_cni_version="1.0.0")
    assert summary(loaded) == summary(delegates)
    assert [d.conf for d in loaded] == [d.conf for d in delegates]
    assert loaded[1].mac_request == "c2:11:22:33:44:55"
    assert loaded[1].gateway_request == ()
    assert loaded[1].filter_v4_gateway and loaded[1].filter_v6_gateway
    assert loaded[1].port_mappings == ()  # not cached, as upstream


def test_upstream_written_cache_loads_and_conflist_gets_top_cni_version():
    raw_conflist = (b'{"name":"l","plugins":[{"type":"bridge"},{"type":"calico",'
                    b'"kubernetes":{"kubeconfig":"/etc/cni/net.d/calico-kubeconfig"}}]}')
    upstream = json.dumps([
        {"Conf": {"ipam": {}, "name": "l"},
         "ConfList": {"name": "l", "plugins": [{"ipam": {}, "type": "bridge"},
                                               {"ipam": {}, "type": "calico"}]},
         "Name": "kube-system/l", "IsFilterV4Gateway": False, "IsFilterV6Gateway": False,
         "Bytes": base64.b64encode(raw_conflist).decode()},
        {"Conf": {"cniVersion": "0.3.1", "ipam": {}, "name": "net1", "type": "macvlan"},
         "ConfList": {}, "Name": "test/net1", "ifnameRequest": "if1",
         "ipRequest": ["10.1.1.5"], "IsFilterV4Gateway": True, "IsFilterV6Gateway": True,
         "deviceID": "0000:03:00.1", "resourceName": "intel.com/sriov",
         "Bytes": base64.b64encode(MACVLAN.encode()).decode()},
        {"Conf": {"cniVersion": "0.3.1", "ipam": {}, "name": "m", "type": "macvlan"},
         "ConfList": {}, "Name": "test/m", "IsFilterV4Gateway": False,
         "IsFilterV6Gateway": False, "Bytes": base64.b64encode(b'{"type":"macvlan"}').decode()},
    ]).encode()
    first, second, third = delegates_from_cache(upstream, top_cni_version="0.4.0",
                                                cni_ifname="eth9")
    assert (first.name, first.ifname, first.master) == ("kube-system/l", "eth9", True)
    assert first.conf == (b'{"cniVersion":"0.4.0","name":"l","plugins":[{"type":"bridge"},'
                          b'{"type":"calico","kubernetes":{"kubeconfig":'
                          b'"/etc/cni/net.d/calico-kubeconfig"}}]}')
    assert (second.ifname, second.ip_request, second.device_id, second.resource_name) == \
        ("if1", ("10.1.1.5",), "0000:03:00.1", "intel.com/sriov")
    assert second.filter_v4_gateway and second.gateway_request is None
    assert second.conf == MACVLAN.encode()  # a plain conf is never rewritten
    assert third.ifname == "net2"


def test_cache_without_bytes_is_rebuilt_from_the_parsed_views():
    data = json.dumps([{"Conf": {"cniVersion": "0.3.1", "ipam": {}, "name": "c",
                                 "type": "bridge"}, "ConfList": {}, "Name": "c"}]).encode()
    (delegate,) = delegates_from_cache(data)
    assert json.loads(delegate.conf)["type"] == "bridge"


@pytest.mark.parametrize("data, expected", [
    (b"{", "not valid JSON"),
    (b'{"a":1}', "not a JSON list"),
    (b'[{"Bytes":"***"}]', "invalid base64"),
    (b'[{"Name":"x"}]', "holds no delegate config"),
    (b'[{"Name":3,"Bytes":"e30="}]', "non-string 'Name'"),
])
def test_corrupt_cache_is_a_decode_failure(data, expected):
    with pytest.raises(DecodeFailure, match=expected):
        delegates_from_cache(data)


def test_empty_cache_list_gives_no_delegates():
    assert delegates_from_cache(b"[]") == []


def test_the_cache_lives_at_cni_dir_slash_container_id_and_reads_none_when_absent(tmp_path):
    path = cache_path(str(tmp_path), "cid1")
    assert path == os.path.join(str(tmp_path), "cid1")
    assert read_cache(path) is None
    write(path, "[]")
    assert read_cache(path) == b"[]"
    os.remove(path)
    os.mkdir(path)
    with pytest.raises(IOFailure, match="the scratch cache .*cid1"):
        read_cache(path)
