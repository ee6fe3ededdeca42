"""multusd.cni.conflist: loading confs and conflists (no plugins run here)."""

from __future__ import annotations

import json

import pytest

from multusd.cni.resultcache import RuntimeConf
from multusd.cni.conflist import NetworkConfigList
from multusd.errors import DecodeFailure, IncompatibleCNIVersion, InvalidNetworkConfig

CONFLIST = {"cniVersion": "1.0.0", "name": "br-net", "disableCheck": "TRUE",
            "plugins": [{"type": "bridge", "bridge": "mdbr0"},
                        {"type": "tuning", "capabilities": {"mac": True}}]}


def test_load_conflist_bytes_keeps_the_exact_bytes():
    data = json.dumps(CONFLIST, indent=3).encode()
    net = NetworkConfigList.load(data, source="/etc/cni/net.d/10-br.conflist")
    assert net.name == "br-net" and net.cni_version == "1.0.0"
    assert [p["type"] for p in net.plugins] == ["bridge", "tuning"]
    assert net.data == data
    assert net.raw == CONFLIST
    assert net.disable_check is True and net.disable_gc is False


def test_load_single_conf_is_a_one_plugin_list():
    conf = {"cniVersion": "0.4.0", "name": "mv", "type": "macvlan", "master": "dummy0"}
    net = NetworkConfigList.load(conf)
    assert net.plugins == (conf,)
    assert net.name == "mv" and net.cni_version == "0.4.0"
    assert json.loads(net.data) == conf


def test_load_dict_is_copied():
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "bridge"}
    net = NetworkConfigList.load(conf)
    conf["type"] = "changed-later"
    assert net.plugins[0]["type"] == "bridge"


def test_load_without_type_or_plugins_suggests_conflist():
    with pytest.raises(InvalidNetworkConfig) as err:
        NetworkConfigList.load(b'{"cniVersion":"1.0.0","name":"x"}', source="/etc/x.conf")
    assert "/etc/x.conf" in err.value.msg
    assert "no 'type'; perhaps this is supposed to be a .conflist?" in err.value.msg


def test_load_bad_json_names_source():
    with pytest.raises(DecodeFailure) as err:
        NetworkConfigList.load(b'{"cniVersion": ', source="ns1/nad1")
    assert "ns1/nad1" in err.value.msg and err.value.code == 6


@pytest.mark.parametrize("raw, fragment", [
    ({"cniVersion": "1.0.0", "name": "n", "plugins": []}, "non-empty list"),
    ({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge"}, {"x": 1}]},
     "plugins[1] has no 'type'"),
    ({"cniVersion": "1.0.0", "type": "bridge"}, "no 'name'"),
    ({"name": "n", "type": "bridge"}, "no 'cniVersion'"),
    ({"cniVersion": "1.0.0", "name": "n", "type": "bridge", "disableGC": "maybe"},
     "'disableGC' must be true or false"),
])
def test_load_rejects_malformed(raw, fragment):
    with pytest.raises(InvalidNetworkConfig) as err:
        NetworkConfigList.load(raw, source="src")
    assert fragment in err.value.msg


@pytest.mark.parametrize("version", ["0.2.0", "2.0.0", "one"])
def test_load_rejects_unsupported_versions(version):
    with pytest.raises(IncompatibleCNIVersion):
        NetworkConfigList.load({"cniVersion": version, "name": "n", "type": "bridge"})


def test_cni_versions_picks_the_newest_supported():
    net = NetworkConfigList.load({"cniVersion": "0.4.0", "cniVersions": ["1.0.0", "9.9.9"],
                                  "name": "n", "plugins": [{"type": "bridge"}]})
    assert net.cni_version == "1.0.0"


def test_runtime_conf_defaults():
    rt = RuntimeConf(container_id="c", netns="/n", ifname="eth0")
    assert rt.args == () and dict(rt.capability_args) == {}
    assert rt.cache_dir == "/var/lib/cni/multus"


def test_a_single_conf_is_read_into_libcnis_netconf_struct_and_a_list_into_a_map():
    """libcni reads one plugin's config into its NetConf struct (Go's field matching: "Type",
    "Name", "CNIVersion" count) and a conflist into a map (its keys exactly)."""
    net = NetworkConfigList.load(b'{"CNIVersion": "0.4.0", "Name": "mv", "TYPE": "macvlan"}')
    assert (net.name, net.cni_version) == ("mv", "0.4.0")
    listed = NetworkConfigList.load(b'{"cniVersion": "1.0.0", "name": "l", '
                                    b'"plugins": [{"Type": "bridge"}]}')
    assert [p["Type"] for p in listed.plugins] == ["bridge"]
    with pytest.raises(InvalidNetworkConfig, match="no 'name'"):
        NetworkConfigList.load(b'{"cniVersion": "1.0.0", "Name": "l", "plugins": [{"type": "x"}]}')


@pytest.mark.parametrize("data, fragment", [
    (b'{"cniVersion": "1.0.0", "name": "n", "type": "bridge", "mtu": NaN}', "NaN is not JSON"),
    (b'{"cniVersion": "1.0.0", "name": "n", "type": "bridge", "mtu": 1e999}', "out of range"),
    (b'{"cniVersion": "1.0.0", "name": "n", "type": "bridge", "x": ' + b"[" * 10001, "max depth"),
])
def test_load_refuses_what_gos_decoder_refuses(data, fragment):
    with pytest.raises(DecodeFailure, match=fragment):
        NetworkConfigList.load(data, source="ns1/nad1")
