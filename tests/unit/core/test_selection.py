"""Network-selection annotation parsing: upstream's good and bad strings, both forms."""

from __future__ import annotations

import pytest

from multusd.errors import InvalidNetworkConfig
from multusd.cni.names import is_valid_ifname
from multusd.core.delegate import Delegate
from multusd.core.scratch import delegates_from_cache, delegates_to_cache
from multusd.core.selection import (DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION, REQUESTS,
                                    NetworkSelection, parse_default_network, parse_ip_or_cidr,
                                    parse_mac, parse_selections, requested)

POD = "test/mypod"


@pytest.mark.parametrize("value, expected", [
    ("net1", [("test", "net1", "")]),
    ("default/net1", [("default", "net1", "")]),
    ("net1@my_interface", [("test", "net1", "my_interface")]),
    ("default/net1@my_interface", [("default", "net1", "my_interface")]),
    (" other / net-a @ if0 , net-b ,kube-system/c",
     [("other", "net-a", "if0"), ("test", "net-b", ""), ("kube-system", "c", "")]),
    ("net1,net1", [("test", "net1", ""), ("test", "net1", "")]),
    ("net1@", [("test", "net1", "")]),
])
def test_comma_form_good_values(value, expected):
    selections = parse_selections(value, "test", pod=POD)
    assert [(s.namespace, s.name, s.interface) for s in selections] == expected
    assert all(s.default_route is None and s.cni_args is None for s in selections)


@pytest.mark.parametrize("value, bad_part, reason", [
    ("root@someIP/root@someOtherIP/root@thirdIP", "root@someIP/root@someOtherIP/root@thirdIP",
     "(failed at '/')"),
    ("root@someIP/root@someOtherIP@garbagevalue", "root@someIP/root@someOtherIP@garbagevalue",
     "(failed at '@')"),
    ("root@someIP/root@someOtherIP", "root@someIP", "lower case alphanumeric"),
    ("default/net1@myIfc Name", "myIfc Name", "without '/' or whitespace"),
    ("default/net1@very_long_interface_name", "very_long_interface_name", "1 to 15"),
    ("Net1", "Net1", "lower case alphanumeric"),
    ("-net1", "-net1", "start and end with an alphanumeric"),
    ("net1,,net2", "empty item", "stray or trailing ','"),
    ("net1,", "empty item", "stray or trailing ','"),
])
def test_comma_form_bad_values_name_pod_annotation_and_part(value, bad_part, reason):
    with pytest.raises(InvalidNetworkConfig) as err:
        parse_selections(value, "test", pod=POD)
    msg = err.value.msg
    assert err.value.code == 7
    assert repr(POD) in msg and repr(NETWORKS_ANNOTATION) in msg
    assert bad_part in msg and reason in msg


def test_comma_form_errors_say_the_expected_form():
    with pytest.raises(InvalidNetworkConfig, match=r"expected \[<namespace>/\]<name>"):
        parse_selections("a/b/c", "test", pod=POD)


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_value_selects_nothing(value):
    assert parse_selections(value, "test") == []


def test_empty_json_list_selects_nothing_and_bare_null_is_a_name():
    assert parse_selections("[]", "test") == []
    # Without [ { or " the value is the comma form, as upstream decides.
    assert [s.name for s in parse_selections("null", "test")] == ["null"]


def test_json_form_reads_every_key():
    value = """[{"name": "macvlan", "namespace": "other", "interface": "eth7",
                 "ips": ["10.1.1.5/24", "fd00::5"], "mac": "c2:11:22:33:44:55",
                 "infiniband-guid": "00:00:00:00:00:00:00:01",
                 "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp",
                                   "extra": 1}],
                 "bandwidth": {"ingressRate": 1000, "egressBurst": 20},
                 "deviceID": "0000:03:00.1", "cni-args": {"a": {"b": 1}},
                 "default-route": ["10.1.1.254"], "ipam-claim-reference": "ignored"}]"""
    (sel,) = parse_selections(value, "test", pod=POD)
    assert sel.name == "macvlan" and sel.namespace == "other" and sel.interface == "eth7"
    assert sel.ips == ("10.1.1.5/24", "fd00::5")
    assert sel.mac == "c2:11:22:33:44:55"
    assert sel.infiniband_guid == "00:00:00:00:00:00:00:01"
    # Re-encoded as upstream's PortMapEntry/BandwidthEntry structs do: known keys only.
    assert sel.port_mappings == ({"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},)
    assert sel.bandwidth == {"ingressRate": 1000, "ingressBurst": 0, "egressRate": 0,
                             "egressBurst": 20}
    assert sel.device_id == "0000:03:00.1"
    assert sel.cni_args == {"a": {"b": 1}}
    assert sel.default_route == ("10.1.1.254",)
    assert sel.to_dict() == {
        "name": "macvlan", "namespace": "other", "ips": ["10.1.1.5/24", "fd00::5"],
        "mac": "c2:11:22:33:44:55", "infiniband-guid": "00:00:00:00:00:00:00:01",
        "interface": "eth7",
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 1000, "ingressBurst": 0, "egressRate": 0,
                      "egressBurst": 20},
        "deviceID": "0000:03:00.1", "cni-args": {"a": {"b": 1}},
        "default-route": ["10.1.1.254"]}
    assert NetworkSelection.from_dict(sel.to_dict()) == sel


def test_json_form_default_route_absent_vs_empty():
    absent, empty = parse_selections('[{"name": "a"}, {"name": "b", "default-route": []}]', "ns")
    assert absent.default_route is None
    assert empty.default_route == ()
    assert "default-route" not in absent.to_dict()
    assert empty.to_dict()["default-route"] == []


def test_json_form_fills_pod_namespace_and_accepts_legacy_and_folded_keys():
    value = '[{"Name": "a", "interfaceRequest": "old0"}, {"name": "b", "interface": "new0", ' \
            '"interfaceRequest": "old1", "NAMESPACE": "x"}]'
    first, second = parse_selections(value, "podns")
    assert (first.namespace, first.name, first.interface) == ("podns", "a", "old0")
    assert (second.namespace, second.interface) == ("x", "new0")


@pytest.mark.parametrize("value, expected", [
    ("[adsfasdfasdfasf]",
     "failed to parse pod Network Attachment Selection Annotation JSON format"),
    ('{"name": "a"}', "wrap it in [ ]"),
    ('["a"]', "element 0 is \"a\", not an object"),
    ('[{"namespace": "x"}]', '"name" is missing or empty'),
    ('[{"name": 5}]', '"name" must be a string'),
    ('[{"name": "a", "mac": "zz:11:22:33:44:55"}]', "failed to parse mac"),
    ('[{"name": "a", "infiniband-guid": "00:11"}]', "failed to validate infiniband GUID"),
    ('[{"name": "a", "ips": ["10.1.1.300"]}]', "failed to parse IP address '10.1.1.300'"),
    ('[{"name": "a", "ips": ["10.1.1.3/33"]}]', "failed to parse CIDR '10.1.1.3/33'"),
    ('[{"name": "a", "ips": "10.1.1.3"}]', '"ips" must be a list of strings'),
    ('[{"name": "a", "default-route": ["gw"]}]', "default-route invalid IP address: gw"),
    ('[{"name": "a", "bandwidth": {"ingressRate": 1.5}}]', "must be an integer"),
    ('[{"name": "a", "portMappings": {"hostPort": 1}}]', '"portMappings" must be a list'),
    ('[{"name": "a", "cni-args": [1]}]', '"cni-args" must be an object'),
    ('[{"name": "a", "interface": "a/b"}]', "interface name 'a/b' is invalid"),
])
def test_json_form_bad_values(value, expected):
    with pytest.raises(InvalidNetworkConfig) as err:
        parse_selections(value, "test", pod=POD)
    assert expected in err.value.msg
    assert repr(POD) in err.value.msg and repr(NETWORKS_ANNOTATION) in err.value.msg


@pytest.mark.parametrize("mac, length", [
    ("00:00:5e:00:53:01", 6),
    ("00-00-5E-00-53-01", 6),
    ("0000.5e00.5301", 6),
    ("02:00:5e:10:00:00:00:01", 8),
    ("0200.5e10.0000.0001", 8),
    ("00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", 20),
    ("0000.0000.fe80.0000.0000.0000.0200.5e10.0000.0001", 20),
])
def test_parse_mac_accepts_go_forms(mac, length):
    assert len(parse_mac(mac)) == length


@pytest.mark.parametrize("mac", [
    "", "00:00:5e:00:53", "00:00:5e:00:53:01:02", "00:00:5e-00:53:01", "0:00:5e:00:53:01:0",
    "00:00:5e:00:53:0g", "0000.5e00.530", "00005e005301",
])
def test_parse_mac_rejects(mac):
    with pytest.raises(ValueError, match="invalid MAC address"):
        parse_mac(mac)


@pytest.mark.parametrize("text, ok", [
    ("10.1.1.5", True), ("10.1.1.5/24", True), ("fd00::1", True), ("fd00::1/64", True),
    ("::ffff:10.1.1.1", True), ("010.1.1.5", False), ("fe80::1%eth0", False),
    ("10.1.1.5/", False), ("10.1.1.5/x", False), ("10.1.1.5/255.255.255.0", False), ("", False),
])
def test_parse_ip_or_cidr(text, ok):
    if ok:
        parse_ip_or_cidr(text)
    else:
        with pytest.raises(ValueError):
            parse_ip_or_cidr(text)


@pytest.mark.parametrize("name, ok", [
    ("eth0", True), ("my_interface", True), ("a" * 15, True), ("a" * 16, False), ("", False),
    ("a b", False), ("a/b", False), (".", False), ("a\tb", False),
])
def test_is_valid_ifname(name, ok):  # the one rule, in cni/names.py
    assert is_valid_ifname(name) is ok


def test_default_network_uses_multus_namespace():
    sel = parse_default_network("alt-bridge", "kube-system", POD)
    assert (sel.namespace, sel.name) == ("kube-system", "alt-bridge")
    sel = parse_default_network('[{"name": "b", "namespace": "x", "interface": "eth9"}]',
                                "kube-system", POD)
    assert (sel.namespace, sel.name, sel.interface) == ("x", "b", "eth9")


@pytest.mark.parametrize("value, expected", [
    ("a,b", "more than one default network is specified: 'a,b'"),
    ("", "the value is empty"),
    ("[]", "no network is named"),
    ("A", "lower case alphanumeric"),
])
def test_default_network_errors(value, expected):
    with pytest.raises(InvalidNetworkConfig) as err:
        parse_default_network(value, "kube-system", POD)
    assert expected in err.value.msg
    assert repr(DEFAULT_NETWORK_ANNOTATION) in err.value.msg and repr(POD) in err.value.msg


def test_every_request_is_a_key_of_the_element_and_a_field_of_the_selection_and_delegate():
    element = {"name": "n", "ips": ["10.1.1.5/24"], "mac": "c2:11:22:33:44:55",
               "infiniband-guid": "c2:11:22:33:44:55:66:77",
               "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
               "bandwidth": {"ingressRate": 1000}, "deviceID": "0000:3b:00.1"}
    selection = NetworkSelection.from_dict(element, "ns")
    assert [r.key for r in REQUESTS] == list(element)[1:]
    assert list(selection.to_dict()) == ["name", "namespace"] + [r.key for r in REQUESTS]
    requests = {r.delegate: getattr(selection, r.attribute) for r in REQUESTS}
    assert all(requested(value) for value in requests.values())
    delegate = Delegate(name="n", conf=b'{"cniVersion": "1.0.0", "name": "n", "type": "x"}',
                        ifname="net1", master=False, **requests)
    # What the scratch cache records comes back on DEL; the rest is not recorded, as upstream.
    back = delegates_from_cache(delegates_to_cache([delegate]))[0]
    for request in REQUESTS:
        kept = getattr(back, request.delegate)
        assert (kept == getattr(delegate, request.delegate)) == bool(request.cache_key), request


# --- read as upstream's Go decoder reads a NetworkSelectionElement (issue 39) -------------------

GO_FIELDS = [
    # (an element's JSON, the attribute, its value as upstream's struct holds it)
    ('{"name": "a", "Bandwidth": {"IngressRate": 1000, "IngressBurst": 2000}}', "bandwidth",
     {"ingressRate": 1000, "ingressBurst": 2000, "egressRate": 0, "egressBurst": 0}),
    ('{"name": "a", "portMappings": [{"HostPort": 8080, "ContainerPort": 80, '
     '"Protocol": "udp", "HOSTIP": "10.0.0.1"}]}', "port_mappings",
     ({"hostPort": 8080, "containerPort": 80, "protocol": "udp", "hostIP": "10.0.0.1"},)),
    ('{"name": "a", "Interface": "net5"}', "interface", "net5"),
    ('{"name": "a", "Default-route": ["10.1.1.254"]}', "default_route", ("10.1.1.254",)),
    ('{"name": "a", "MAC": "c2:11:22:33:44:55"}', "mac", "c2:11:22:33:44:55"),
    ('{"name": "a", "IPS": ["10.1.1.5"]}', "ips", ("10.1.1.5",)),
    ('{"name": "a", "Cni-Args": {"vlan": 1e2}}', "cni_args", {"vlan": 100.0}),
    ('{"name": "a", "DeviceId": "0000:03:00.1"}', "device_id", "0000:03:00.1"),
    ('{"name": "a", "Infiniband-GUID": "00:00:00:00:00:00:00:01"}', "infiniband_guid",
     "00:00:00:00:00:00:00:01"),
    ('{"name": "a", "ınterface": "net5"}', "interface", ""),      # dotless i: no match in Go
    ('{"name": "a", "\u0131nterface": "x", "interface": "net5"}', "interface", "net5"),
    ('{"name": "a", "portMappings": [{"ho\u017ftPort": 1, "containerPort": 2}]}',
     "port_mappings", ({"hostPort": 1, "containerPort": 2},)),   # ſ folds onto s
    ('{"name": "a", "bandwidth": {"ingressRate": 5, "IngressRate": 7}}', "bandwidth",
     {"ingressRate": 7, "ingressBurst": 0, "egressRate": 0, "egressBurst": 0}),
    ('{"name": "a", "mac": "c2:11:22:33:44:55", "mac": null}', "mac", "c2:11:22:33:44:55"),
    ('{"name": "a", "interface": "net5", "Interface": "net6"}', "interface", "net6"),
    ('{"name": "a", "ips": ["10.1.1.5"], "ips": null}', "ips", ()),
    ('{"name": "a", "bandwidth": {"ingressRate": 1}, "bandwidth": {"egressRate": 2}}',
     "bandwidth", {"ingressRate": 1, "ingressBurst": 0, "egressRate": 2, "egressBurst": 0}),
    ('{"name": "a", "cni-args": {"x": 1}, "cni-args": {"y": 2}}', "cni_args", {"x": 1, "y": 2}),
    ('{"name": "a", "default-route": [""]}', "default_route", ("",)),
    ('{"name": "a", "default-route": [null]}', "default_route", ("",)),
    ('{"name": "a", "default-route": null}', "default_route", None),
    ('{"name": "a", "portMappings": [null]}', "port_mappings", (None,)),
]


@pytest.mark.parametrize("element, attribute, expected", GO_FIELDS)
def test_an_element_is_read_as_upstreams_go_struct(element, attribute, expected):
    (selection,) = parse_selections(f"[{element}]", "ns", pod=POD)
    assert getattr(selection, attribute) == expected


@pytest.mark.parametrize("element, expected", [
    # Go refuses a value of the wrong type even where a later key replaces it
    ('{"name": "a", "mac": 5, "MAC": "c2:11:22:33:44:55"}', '"mac" must be a string'),
    ('{"name": "a", "bandwidth": {"ingressRate": 1.0}}', '"bandwidth.ingressRate" must be an '
                                                         'integer, got 1'),
    ('{"name": "a", "bandwidth": {"ingressRate": 1e3}}', "must be an integer"),
    ('{"name": "a", "portMappings": [{"hostPort": 9223372036854775808}]}', "must be an integer"),
    ('{"name": "a", "ips": [null]}', "failed to parse IP address ''"),
    ('{"name": "a", "default-route": ["", "gw"]}', "default-route invalid IP address: gw"),
    ('{"name": "a", "default-route": [5]}', '"default-route" must be a list of strings'),
    ('{"name": "a", "cni-args": {"x": NaN}}', "NaN is not JSON"),
    ('{"name": "a", "cni-args": {"x": 1e400}}', "out of range"),
    ('{"name": "a"', "invalid character ']' after object key:value pair"),
])
def test_what_upstreams_decoder_refuses_is_refused(element, expected):
    with pytest.raises(InvalidNetworkConfig, match=expected.replace("[", r"\[")
                       .replace(".", r"\.")):
        parse_selections(f"[{element}]", "ns", pod=POD)


def test_an_annotation_nested_past_gos_limit_is_an_invalid_config_not_a_recursion_error():
    with pytest.raises(InvalidNetworkConfig, match="exceeded max depth"):
        parse_selections('[{"name": "a", "cni-args": {"x": ' + "[" * 10001 + "]" * 10001 + "}}]",
                         "ns", pod=POD)
    deep = "[" * 9000 + "]" * 9000
    (selection,) = parse_selections('[{"name": "a", "cni-args": {"x": ' + deep + '}}]', "ns")
    assert isinstance(selection.cni_args["x"], list)


def test_lone_surrogates_in_an_annotation_read_as_replacement_characters():
    (selection,) = parse_selections('[{"name": "a", "cni-args": {"k": "\\ud800"}}]', "ns")
    assert selection.cni_args == {"k": "\ufffd"}
