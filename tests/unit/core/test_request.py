"""multusd.core.request: the shim's body decoded, the CNI env and config checked, the daemon's
config laid over the runtime's (F08, F09), and the pod identity that heads every error."""

from __future__ import annotations

import base64
import json

import pytest

from multusd import go_field, go_loads
from multusd.config import daemonconf
from multusd.core.request import (check_cni_args, check_runtime_config, decode_body, parse,
                                  pod_prefix)
from multusd.errors import (DecodeFailure, IncompatibleCNIVersion, InvalidEnvironment,
                            InvalidNetworkConfig)

CONF = {"cniVersion": "0.4.0", "name": "multus-cni-network", "type": "multus-shim"}
ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/p",
       "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u1"}
DAEMON = daemonconf.from_dict({"clusterNetwork": "cbr0", "cniDir": "/c"})


def request(env=None, conf=None, drop=()):
    env = {k: v for k, v in dict(ENV, **(env or {})).items() if k not in drop}
    return parse(env, json.dumps(dict(CONF, **(conf or {}))).encode(), DAEMON)


def test_a_request_has_the_runtimes_env_and_the_merged_config():
    req = request()
    assert (req.command, req.container_id, req.netns, req.ifname) == \
        ("ADD", "c1", "/var/run/netns/p", "eth0")
    assert (req.pod_namespace, req.pod_name, req.pod_uid, req.has_pod) == \
        ("ns", "web", "u1", True)
    assert req.config == dict(CONF, clusterNetwork="cbr0", cniDir="/c")  # daemon keys win
    assert json.loads(req.config_bytes) == CONF  # the runtime's bytes as sent
    assert req.cni_version == "0.4.0"


def test_status_and_gc_need_no_sandbox():
    for command in ("STATUS", "GC"):
        req = parse({"CNI_COMMAND": command}, json.dumps(CONF).encode(), DAEMON)
        assert (req.command, req.container_id, req.netns, req.args) == (command, "", "", ())


@pytest.mark.parametrize("env, drop, expected", [
    ({"CNI_COMMAND": "VERSION"}, (), "unexpected or missing CNI_COMMAND 'VERSION'"),
    ({}, ("CNI_ARGS",), "missing CNI_ARGS"),
    ({"CNI_IFNAME": ""}, (), "missing CNI_IFNAME"),
    ({"CNI_IFNAME": "a/b"}, (), "invalid CNI_IFNAME 'a/b'"),
    ({"CNI_NETNS": ""}, (), "CNI_NETNS is empty: ADD needs"),
    ({"CNI_CONTAINERID": ""}, (), "CNI_CONTAINERID is empty"),
    ({"CNI_CONTAINERID": "../etc"}, (), "invalid CNI_CONTAINERID '../etc'"),
    ({"CNI_ARGS": "K8S_POD_NAMESPACE=ns"}, (), "missing K8S_POD_NAME in CNI_ARGS"),
    ({"CNI_ARGS": "A=1;A=2"}, (), "A is given more than once"),
])
def test_what_the_runtime_must_send_is_refused_with_the_field_named(env, drop, expected):
    with pytest.raises(InvalidEnvironment) as err:
        request(env, None, drop)
    assert expected in err.value.msg


def test_del_may_come_without_a_netns_or_a_container_id():
    assert request({"CNI_COMMAND": "DEL", "CNI_NETNS": ""}).netns == ""
    assert request({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": ""}).container_id == ""


def test_a_container_that_is_not_a_pod_has_no_pod_identity():
    req = request({"CNI_ARGS": "K8S_POD_NAME=podman-ctr"})
    assert not req.has_pod and req.pod_name == "podman-ctr"


@pytest.mark.parametrize("conf, error, expected", [
    ({"cniVersion": None}, InvalidNetworkConfig, 'has no "cniVersion"'),  # null: unset, as Go
    ({"cniVersion": 1}, InvalidNetworkConfig, '"cniVersion" in the CNI config from the '
                                              'runtime must be a string, not a number'),
    ({"cniVersion": "9.9.9"}, IncompatibleCNIVersion, "'9.9.9'"),
    ({"name": " "}, InvalidNetworkConfig, '"name" in the CNI config from the runtime is empty'),
    ({"clusterNetwork": ["a"]}, InvalidNetworkConfig, '"clusterNetwork" in the CNI config '
                                                      'from the runtime must be a string'),
    ({"delegates": {}}, InvalidNetworkConfig, "must be a list, not an object"),
])
def test_the_runtimes_config_is_checked_key_by_key(conf, error, expected):
    with pytest.raises(error) as err:
        check_runtime_config(dict(CONF, **conf))
    assert expected in err.value.msg


def test_a_config_without_type_is_fine_for_a_conflist_only():
    check_runtime_config({"cniVersion": "1.0.0", "name": "l", "plugins": []})
    with pytest.raises(InvalidNetworkConfig, match='has no "type"'):
        check_runtime_config({"cniVersion": "1.0.0", "name": "l"})


def test_a_key_twice_in_the_runtimes_config_keeps_its_last_value_as_upstream():
    raw = b'{"cniVersion":"0.4.0","name":"a","name":"b","type":"multus-shim"}'
    assert parse(ENV, raw, DAEMON).config["name"] == "b"


@pytest.mark.parametrize("raw, expected", [
    # upstream's NetConf struct: keys in another case set the field
    (b'{"CNIVersion":"0.4.0","Name":"a","TYPE":"multus-shim"}', "0.4.0"),
    # read into a map first, then written out with its keys sorted: "cniVersion" comes last
    (b'{"cniVersion":"0.4.0","CNIVersion":"1.0.0","name":"a","type":"multus-shim"}', "0.4.0"),
])
def test_the_runtimes_config_is_read_as_upstreams_netconf_struct(raw, expected):
    assert go_field(parse(ENV, raw, DAEMON).config, "cniVersion") == expected


def test_a_null_after_a_value_in_the_runtimes_config_is_the_maps_null():
    raw = b'{"cniVersion":"0.4.0","name":"a","type":"multus-shim","cniVersion":null}'
    with pytest.raises(InvalidNetworkConfig, match='has no "cniVersion"'):
        parse(ENV, raw, DAEMON)


@pytest.mark.parametrize("raw, fragment", [
    (b'{"cniVersion":"0.4.0","name":"a","type":"x","mtu":NaN}', "NaN is not JSON"),
    (b'{"cniVersion":"0.4.0","name":"a","type":"x","mtu":1e400}', "out of range"),
    (b'\xef\xbb\xbf{"cniVersion":"0.4.0","name":"a","type":"x"}', "byte order mark"),
    (b'[' * 20000, "exceeded max depth"),
])
def test_json_upstream_refuses_is_a_decode_failure_saying_why(raw, fragment):
    with pytest.raises(DecodeFailure, match=fragment):
        parse(ENV, raw, DAEMON)


def test_ignore_unknown_must_be_a_go_boolean():
    check_cni_args((("IgnoreUnknown", "1"), ("IgnoreUnknown2", "x")))
    with pytest.raises(InvalidEnvironment, match="IgnoreUnknown='yes' is not a boolean"):
        check_cni_args((("IgnoreUnknown", "yes"),))


def test_decode_body_takes_the_shims_json_and_says_what_it_expects():
    config = json.dumps(CONF).encode()
    body = json.dumps({"env": ENV, "config": base64.b64encode(config).decode(),
                       "interfaceAttributes": {"mac": "c2:11:22:33:44:55"}}).encode()
    assert decode_body(body) == (ENV, config, {"mac": "c2:11:22:33:44:55"})
    for bad, expected in ((b"{", "not valid JSON"), (b"[]", "must be a JSON object"),
                          (b'{"env":{"A":1},"config":"e30="}', "an object of strings"),
                          (b'{"env":{},"config":""}', "non-empty base64 string"),
                          (b'{"env":{},"config":"***"}', "not valid base64"),
                          (b'{"env":{},"config":"e30=","interfaceAttributes":[]}',
                           '"interfaceAttributes" must be an object')):
        with pytest.raises(DecodeFailure) as err:
            decode_body(bad)
        assert expected in err.value.msg


def test_decode_body_reads_the_request_as_upstreams_api_request_struct():
    """Go's field matching ("Env"), a null string in the env map is "", and the hot-plug
    attributes as upstream's DelegateInterfaceAttributes (ips, mac, cni-args)."""
    config = json.dumps(CONF).encode()
    body = ('{"Env": {"CNI_COMMAND": "ADD", "CNI_ARGS": null}, "CONFIG": "'
            + base64.b64encode(config).decode() + '", "interfaceAttributes": '
            '{"MAC": "c2:11:22:33:44:55", "IPs": ["10.0.0.5"], "Cni-Args": {"vlan": 1e2}, '
            '"other": 1}}').encode()
    env, got, attributes = decode_body(body)
    assert env == {"CNI_COMMAND": "ADD", "CNI_ARGS": ""} and got == config
    assert attributes == {"mac": "c2:11:22:33:44:55", "ips": ["10.0.0.5"],
                          "cni-args": {"vlan": 100.0}}
    with pytest.raises(DecodeFailure, match="NaN is not JSON"):
        decode_body(b'{"env": {}, "config": "e30=", "x": NaN}')
    for attributes, expected in (('{"ips": 5}', '"ips" must be a list of strings'),
                                 ('{"ips": [5]}', '"ips" must be a list of strings'),
                                 ('{"mac": 5, "mac": "x"}', '"mac" must be a string'),
                                 ('{"cni-args": []}', '"cni-args" must be an object')):
        with pytest.raises(DecodeFailure, match=expected):
            decode_body(b'{"env": {}, "config": "e30=", "interfaceAttributes": '
                        + attributes.encode() + b"}")
    assert decode_body(b'{"env": {}, "config": "e30=", "interfaceAttributes": '
                       b'{"ips": ["10.0.0.5", null]}}')[2] == {"ips": ["10.0.0.5", ""]}


def test_pod_prefix_names_the_pod_or_the_container():
    assert pod_prefix(request()) == "[ns/web/u1]"
    assert pod_prefix(request(), "ns/net1") == "[ns/web/u1:ns/net1]"
    assert pod_prefix(request({"CNI_ARGS": "K8S_POD_NAME=ctr"}), "n") == "[container ctr:n]"
    assert pod_prefix(request({"CNI_ARGS": ""})) == "[container c1]"
