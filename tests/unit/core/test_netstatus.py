"""network-status entries and their exact text (NAD utils v1.7.6 + Go's MarshalIndent)."""

from __future__ import annotations

import json

from multusd.core.netstatus import format_network_status, status_entries
from multusd.store import go_json

SANDBOX = "/var/run/netns/cni-1234"


def bridge_result(**extra):
    result = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "92:79:27:01:7c:ce", "sandbox": SANDBOX}],
        "ips": [{"address": "10.244.1.2/24", "gateway": "10.244.1.1", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}, {"dst": "10.9.0.0/16"}],
        "dns": {},
    }
    result.update(extra)
    return result


def test_single_interface_text_is_byte_for_byte_upstream():
    master = status_entries("cbr0", bridge_result(), default=True)
    second = status_entries("test/net1", {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "net1", "mac": "ea:0e:fa:63:95:f9", "mtu": 9000,
                        "sandbox": SANDBOX}],
        "ips": [{"address": "1.1.1.1/24"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.local"]},
    }, default=False)
    expected = (
        '[{\n'
        '    "name": "cbr0",\n'
        '    "interface": "eth0",\n'
        '    "ips": [\n'
        '        "10.244.1.2"\n'
        '    ],\n'
        '    "mac": "92:79:27:01:7c:ce",\n'
        '    "default": true,\n'
        '    "dns": {},\n'
        '    "gateway": [\n'
        '        "10.244.1.1"\n'
        '    ]\n'
        '},{\n'
        '    "name": "test/net1",\n'
        '    "interface": "net1",\n'
        '    "ips": [\n'
        '        "1.1.1.1"\n'
        '    ],\n'
        '    "mac": "ea:0e:fa:63:95:f9",\n'
        '    "mtu": 9000,\n'
        '    "dns": {\n'
        '        "nameservers": [\n'
        '            "10.96.0.10"\n'
        '        ],\n'
        '        "search": [\n'
        '            "svc.local"\n'
        '        ]\n'
        '    }\n'
        '}]')
    assert format_network_status(master + second) == expected


def test_empty_list_and_result_without_interfaces():
    assert format_network_status([]) == "[]"
    # Upstream writes no entry for an interface-less result (e.g. a converted 0.2.0 result).
    assert status_entries("n", {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]},
                          default=True) == []


def test_single_interface_without_sandbox_has_no_interface_keys():
    result = bridge_result(interfaces=[{"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"}])
    (entry,) = status_entries("n", result, default=False)
    assert list(entry) == ["name", "ips", "dns", "gateway"]


def test_multi_interface_maps_ips_by_index_and_marks_the_gateway_interface():
    result = {
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "br0", "mac": "00:00:00:00:00:01"},                 # host side
            {"name": "eth0", "mac": "00:00:00:00:00:02", "sandbox": SANDBOX},
            {"name": "eth1", "mac": "00:00:00:00:00:03", "sandbox": SANDBOX},
        ],
        "ips": [
            {"address": "10.0.0.2/24", "interface": 1},
            {"address": "fd00::3/64", "gateway": "fd00::1", "interface": 2},
            {"address": "10.0.9.9/24", "interface": 0},                  # host side: dropped
            {"address": "192.168.0.7/24"},                               # no index: last
        ],
        "routes": [{"dst": "::/0", "gw": "fd00::1"}],
    }
    entries = status_entries("multi", result, default=True)
    assert [(e["interface"], e.get("ips"), e.get("default")) for e in entries] == [
        ("eth0", ["10.0.0.2"], None),
        ("eth1", ["fd00::3", "192.168.0.7"], True),
    ]
    assert all(e["gateway"] == ["fd00::1"] and e["dns"] == {} for e in entries)


def test_multi_interface_without_gateway_marks_first_sandbox_interface_only_if_default():
    result = {"interfaces": [{"name": "a", "sandbox": SANDBOX}, {"name": "b", "sandbox": SANDBOX}],
              "ips": []}
    assert [e.get("default") for e in status_entries("m", result, default=True)] == [True, None]
    assert [e.get("default") for e in status_entries("m", result, default=False)] == [None, None]
    # Empty ips are omitted, as Go's omitempty does.
    assert all("ips" not in e for e in status_entries("m", result, default=False))


def test_default_route_detection_and_go_ip_formatting():
    routes = [
        {"gw": "10.0.0.1"},                          # no dst: a default route for Go
        {"dst": "0.0.0.0/0", "gw": "::ffff:10.0.0.2"},  # IPv4-mapped printed as IPv4
        {"dst": "::0/0", "gw": "FD00:0:0::1"},
        {"dst": "10.0.0.0/8", "gw": "10.0.0.3"},     # not a default route
        {"dst": "0.0.0.0/0"},                        # no gateway: nothing to report
    ]
    (entry,) = status_entries("n", bridge_result(routes=routes), default=False)
    assert entry["gateway"] == ["10.0.0.1", "10.0.0.2", "fd00::1"]


def test_device_info_in_struct_order_and_unknown_keys_dropped():
    info = {"version": "1.1.0", "pci": {"rdma-device": "mlx5_0", "pci-address": "0000:03:00.1",
                                        "other": 1}, "type": "pci", "vendor-thing": True}
    (entry,) = status_entries("n", bridge_result(), default=False, device_info=info)
    assert list(entry) == ["name", "interface", "ips", "mac", "dns", "device-info", "gateway"]
    assert json.dumps(entry["device-info"]) == json.dumps(
        {"type": "pci", "version": "1.1.0",
         "pci": {"pci-address": "0000:03:00.1", "rdma-device": "mlx5_0"}})


def test_go_json_escapes_like_go_and_keeps_utf8():
    assert go_json({"a": "<b>&\u2028é"}) == '{"a":"\\u003cb\\u003e\\u0026\\u2028é"}'
    assert go_json({"b": 1, "a": [1, {}]}, sort_keys=True) == '{"a":[1,{}],"b":1}'
    assert go_json({"a": []}, indent=4) == '{\n    "a": []\n}'
