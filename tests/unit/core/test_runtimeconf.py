"""Per-delegate runtimeConfig, legacy CNI_ARGS, cni-args injection, undeclared requests."""

from __future__ import annotations

import copy
import json

import pytest

from multusd.store.valueclass import replace

from multusd.core.delegate import Delegate
from multusd.errors import InvalidNetworkConfig
from multusd.core.runtimeconf import (declared_capabilities, delegate_capability_args,
                                     device_info_path, inject_cni_args, legacy_cni_args,
                                     undeclared_requests)
from multusd.core.selection import parse_selections

BRIDGE = b'{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}'
MACVLAN = (b'{"cniVersion":"1.0.0","name":"m","type":"macvlan",'
           b'"capabilities":{"mac":true,"ips":true},"ipam":{"type":"static"}}')

GLOBAL = {"portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}],
          "bandwidth": {"ingressRate": 1, "ingressBurst": 2, "egressRate": 3, "egressBurst": 4},
          "io.kubernetes.cri.pod-annotations": {"a": "b"}}


def nad_delegate(annotation: str, ifname: str = "net1", **fields) -> Delegate:
    (sel,) = parse_selections(annotation, "test")
    return Delegate(name=f"{sel.namespace}/{sel.name}", conf=MACVLAN, ifname=ifname,
                    master=False, selection=sel, ifname_request=sel.interface,
                    mac_request=sel.mac, ip_request=sel.ips, device_id=sel.device_id,
                    infiniband_guid_request=sel.infiniband_guid,
                    port_mappings=sel.port_mappings, bandwidth=sel.bandwidth, **fields)


def test_master_gets_a_copy_of_the_global_runtime_config_only():
    master = Delegate(name="cbr0", conf=BRIDGE, ifname="eth0", master=True,
                      mac_request="c2:11:22:33:44:55")
    args = delegate_capability_args(GLOBAL, master)
    assert args == GLOBAL
    args["portMappings"].append({"hostPort": 1, "containerPort": 1})
    assert len(GLOBAL["portMappings"]) == 1  # a deep copy, not the caller's lists


def test_non_master_selection_values_override_and_never_leak_into_the_next_delegate():
    snapshot = copy.deepcopy(GLOBAL)
    first = nad_delegate('[{"name": "a", "mac": "c2:11:22:33:44:55", "ips": ["10.1.1.5/24"], '
                         '"portMappings": [{"hostPort": 9, "containerPort": 9}], '
                         '"infiniband-guid": "00:00:00:00:00:00:00:01", '
                         '"deviceID": "0000:03:00.1"}]')
    second = nad_delegate('[{"name": "b"}]', ifname="net2")
    first_args = delegate_capability_args(GLOBAL, first, container_id="cid")
    second_args = delegate_capability_args(GLOBAL, second, container_id="cid")
    assert first_args["mac"] == "c2:11:22:33:44:55"
    assert first_args["ips"] == ["10.1.1.5/24"]
    assert first_args["portMappings"] == [{"hostPort": 9, "containerPort": 9}]
    assert first_args["infinibandGUID"] == "00:00:00:00:00:00:00:01"
    assert first_args["deviceID"] == "0000:03:00.1"
    assert first_args["CNIDeviceInfoFile"] == \
        "/var/run/k8s.cni.cncf.io/devinfo/cni/test-a-cid_net1"
    # Upstream quirk kept: without its own values a non-master inherits the global ones.
    assert first_args["bandwidth"] == GLOBAL["bandwidth"]
    assert second_args == GLOBAL
    assert GLOBAL == snapshot


def test_empty_capability_values_are_left_out_and_runtime_device_info_is_replaced():
    delegate = nad_delegate('[{"name": "a"}]')
    args = delegate_capability_args(
        {"mac": "", "ips": [], "portMappings": [], "bandwidth": None, "deviceID": "d1",
         "CNIDeviceInfoFile": "/elsewhere", "dns": {}}, delegate, container_id="c")
    assert args == {"deviceID": "d1", "dns": {},
                    "CNIDeviceInfoFile": device_info_path("test/a", "c", "net1")}
    assert delegate_capability_args(None, delegate) == {}


def test_legacy_cni_args():
    delegate = nad_delegate('[{"name": "a", "mac": "c2:11:22:33:44:55", '
                            '"ips": ["10.1.1.5/24", "fd00::5"]}]')
    assert legacy_cni_args(delegate) == [("MAC", "c2:11:22:33:44:55"),
                                         ("IP", "10.1.1.5/24,fd00::5")]
    assert legacy_cni_args(nad_delegate('[{"name": "a"}]')) == []


@pytest.mark.parametrize("fields, expected", [
    ({"mac_request": "nope"}, "failed to parse mac address 'nope'"),
    ({"ip_request": ("10.0.0.1", "300.1.1.1")}, "failed to parse IP address '300.1.1.1'"),
])
def test_legacy_cni_args_errors(fields, expected):
    delegate = Delegate(name="test/a", conf=MACVLAN, ifname="net1", master=False, **fields)
    with pytest.raises(InvalidNetworkConfig, match=expected):
        legacy_cni_args(delegate)


def test_inject_cni_args_into_a_conf_merges_and_keeps_unknown_keys():
    conf = (b'{"type":"bridge","name":"n","args":{"cni":{"args0":"val0","args1":"val1"},'
            b'"other":{"k":1}},"vendor":{"z":[1,2]}}')
    out = json.loads(inject_cni_args(conf, {"args1": "val1a", "args2": {"x": 1}}))
    assert out["args"] == {"cni": {"args0": "val0", "args1": "val1a", "args2": {"x": 1}},
                           "other": {"k": 1}}
    assert out["vendor"] == {"z": [1, 2]}
    assert out["name"] == "n" and out["type"] == "bridge"


def test_inject_cni_args_into_every_plugin_of_a_conflist():
    conflist = (b'{"cniVersion":"1.0.0","name":"l","plugins":[{"type":"bridge"},'
                b'{"type":"tuning","args":{"cni":{"keep":"me","args1":"old"}}}]}')
    original = bytes(conflist)
    out = json.loads(inject_cni_args(conflist, {"args1": "new"}))
    assert out["plugins"][0]["args"] == {"cni": {"args1": "new"}}
    assert out["plugins"][1]["args"] == {"cni": {"keep": "me", "args1": "new"}}
    assert conflist == original


def test_cni_args_numbers_are_written_as_upstreams_go_encoder_writes_them():
    """Upstream decodes cni-args into interface{} (every number a float64) and marshals the
    config again: 1e2 is written 100 (a plugin that decodes an integer takes it), 1.0 is 1."""
    (selection,) = parse_selections('[{"name": "n", "cni-args": {"vlan": 1e2, "mtu": 1.0, '
                                    '"ratio": 0.5, "tiny": 1e-7, "big": 1e21}}]', "ns")
    out = inject_cni_args(b'{"type":"vlan","name":"n"}', selection.cni_args)
    assert out == (b'{"args":{"cni":{"big":1e+21,"mtu":1,"ratio":0.5,"tiny":1e-7,"vlan":100}},'
                   b'"name":"n","type":"vlan"}')


def test_a_conf_with_type_in_another_case_gets_cni_args_as_a_conf_upstream():
    out = json.loads(inject_cni_args(b'{"Type":"vlan","name":"n"}', {"a": 1}))
    assert out["args"] == {"cni": {"a": 1}}


def test_inject_cni_args_output_is_sorted_like_upstream():
    assert inject_cni_args(b'{"type":"b","name":"n"}', {"z": 1}) == \
        b'{"args":{"cni":{"z":1}},"name":"n","type":"b"}'


@pytest.mark.parametrize("conf, expected", [
    (b'{"type":"b","args":"x"}', "'args' must be an object"),
    (b'{"type":"b","args":{"cni":[1]}}', "'args.cni' must be an object"),
    (b'{"name":"n"}', "neither 'type' nor 'plugins'"),
    (b'[1]', "must be a JSON object"),
    (b'{', "not valid JSON"),
])
def test_inject_cni_args_errors(conf, expected):
    with pytest.raises(InvalidNetworkConfig, match=expected):
        inject_cni_args(conf, {"a": "b"})


def test_declared_capabilities_of_conf_and_conflist():
    assert declared_capabilities(MACVLAN) == {"mac": True, "ips": True}
    conflist = (b'{"name":"l","plugins":[{"type":"macvlan","capabilities":{"ips":true}},'
                b'{"type":"tuning","capabilities":{"mac":true,"bandwidth":false}}]}')
    assert declared_capabilities(conflist) == {"ips": True, "mac": True}


def test_declared_requests_need_no_word():
    assert undeclared_requests(nad_delegate('[{"name": "m", "mac": "c2:11:22:33:44:55", '
                                            '"ips": ["10.1.1.5/24"]}]')) == []
    assert undeclared_requests(Delegate(name="cbr0", conf=BRIDGE, ifname="eth0",
                                        master=True)) == []


def test_undeclared_ips_and_mac_go_on_as_legacy_cni_args_with_a_warning():
    delegate = replace(nad_delegate('[{"name": "b", "namespace": "x", "ips": ["10.1.1.5/24"],'
                                    ' "mac": "c2:11:22:33:44:55"}]'), conf=BRIDGE)
    lines = undeclared_requests(delegate)
    assert len(lines) == 2
    assert lines[0].startswith("network 'x/b': the pod requests 'ips' but no plugin")
    assert "legacy CNI_ARGS IP=, as upstream does" in lines[0]
    assert '"capabilities": {"mac": true}' in lines[1] and "CNI_ARGS MAC=" in lines[1]
    # never refused: the legacy args are still built, exactly upstream's
    assert legacy_cni_args(delegate) == [("MAC", "c2:11:22:33:44:55"), ("IP", "10.1.1.5/24")]


def test_other_undeclared_requests_are_dropped_with_a_warning():
    annotation = ('[{"name": "m", "infiniband-guid": "c2:11:22:33:44:55:66:77", '
                  '"portMappings": [{"hostPort": 1, "containerPort": 1}], '
                  '"bandwidth": {"ingressRate": 1}, "deviceID": "0000:03:00.1"}]')
    lines = undeclared_requests(nad_delegate(annotation))
    assert [line.split("'")[3] for line in lines] == ["infiniband-guid", "portMappings",
                                                     "bandwidth", "deviceID"]
    assert all("not passed on, as upstream does" in line for line in lines)
    # a device plugin's ID is written into the config (F41): nothing is dropped
    from_resource = replace(nad_delegate('[{"name": "m", "deviceID": "0000:03:00.1"}]'),
                            resource_name="intel.com/sriov")
    assert undeclared_requests(from_resource) == []
