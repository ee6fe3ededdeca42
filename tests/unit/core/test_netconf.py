"""multusd.core.netconf: conf and conflist files (the subdirectory chain), a directory's first
conf, a NAD's spec.config, and a clusterNetwork/defaultNetworks name looked up in both.

Conf files are real files under tmp_path; NADs are plain objects behind the NadGetter seam
(the only stand-in: Kubernetes itself).
"""

from __future__ import annotations

import json

import pytest

from multusd.core.netconf import (chained_conflist, check_delegate_conf, find_conf_by_name,
                                  load_conf_file, nad_config, nad_resource_name, network_name,
                                  resolve_network)
from multusd.errors import InvalidNetworkConfig, TryAgainLater

from nads import MACVLAN, Nad, Nads, write


def test_conflist_load_only_inlined_plugins_skips_the_chain(tmp_path):
    path = write(tmp_path / "l.conflist", '{"name":"l","loadOnlyInlinedPlugins":"true",'
                                          '"plugins":[{"type":"bridge"}]}')
    write(tmp_path / "l" / "50-tuning.conf", {"type": "tuning"})
    assert b"tuning" not in load_conf_file(path)


@pytest.mark.parametrize("filename, content, expected", [
    ("x.conf", {"name": "l", "plugins": [{"type": "bridge"}]},
     "no 'type'; perhaps this is supposed to be a .conflist?"),
    ("x.conflist", {"plugins": [{"type": "bridge"}]}, "no name"),
    ("x.conflist", {"name": "l", "plugins": []}, "'plugins' must be a non-empty list"),
    ("x.conflist", {"name": "l"}, "no plugin configs found"),
    ("x.conflist", {"name": "l", "plugins": [{"name": "p"}]},
     "failed to parse plugin config 0: missing 'type'"),
    ("x.conflist", {"name": "../l", "plugins": [{"type": "bridge"}]},
     "invalid network config name '../l'"),
    ("x.conf", "{not json", "error parsing configuration"),
])
def test_load_conf_file_errors(tmp_path, filename, content, expected):
    path = write(tmp_path / filename, content)
    with pytest.raises(InvalidNetworkConfig) as err:
        load_conf_file(path)
    assert expected in err.value.msg and repr(path) in err.value.msg


def test_find_conf_by_name_and_broken_files(conf_dir):
    assert find_conf_by_name(conf_dir, "x") is None  # no directory: nothing found
    write(f"{conf_dir}/20-b.conflist", {"name": "b", "plugins": [{"type": "bridge"}]})
    write(f"{conf_dir}/30-odd.conflist", {"name": "has space", "plugins": [{"type": "ptp"}]})
    write(f"{conf_dir}/.10-a.conf.tmp", "garbage")
    assert json.loads(find_conf_by_name(conf_dir, "b"))["name"] == "b"
    assert json.loads(find_conf_by_name(conf_dir, "has space"))["name"] == "has space"
    assert find_conf_by_name(conf_dir, "zzz") is None
    write(f"{conf_dir}/10-broken.conf", {"name": "broken"})
    with pytest.raises(InvalidNetworkConfig, match="10-broken.conf.*no 'type'"):
        find_conf_by_name(conf_dir, "b")


@pytest.mark.parametrize("config, expected", [
    ("{bad", "spec.config is not valid JSON"),
    ('["x"]', "must be a JSON object"),
    ('{"name":"n"}', "delegate must have the 'type' or 'plugin' field"),
])
def test_nad_config_errors(conf_dir, config, expected):
    with pytest.raises(InvalidNetworkConfig) as err:
        nad_config(Nad("test", "n", config), conf_dir)
    assert "network-attachment-definition test/n" in err.value.msg and expected in err.value.msg


def test_resolve_network_returns_resource_name_of_a_nad(conf_dir):
    nads = Nads(Nad("kube-system", "n", MACVLAN, {"k8s.v1.cni.cncf.io/resourceName": "r/x"}))
    assert resolve_network("n", multus_namespace="kube-system", conf_dir=conf_dir,
                           get_nad=nads) == ("kube-system/n", MACVLAN.encode(), "r/x")


def test_a_broken_nad_is_reported_rather_than_hidden_by_the_file_fallback(conf_dir):
    write(f"{conf_dir}/10-n.conf", {"name": "n", "type": "bridge"})
    nads = Nads(Nad("kube-system", "n", "{broken"))
    with pytest.raises(InvalidNetworkConfig, match="spec.config is not valid JSON"):
        resolve_network("n", multus_namespace="kube-system", conf_dir=conf_dir, get_nad=nads)


def test_a_name_is_a_nad_in_multus_namespace_first_then_a_conf_file(conf_dir):
    write(f"{conf_dir}/10-n.conf", {"name": "n", "type": "bridge"})
    nads = Nads(Nad("kube-system", "n", MACVLAN))
    assert resolve_network("n", multus_namespace="kube-system", conf_dir=conf_dir,
                           get_nad=nads)[0] == "kube-system/n"
    name, conf, resource = resolve_network("n", multus_namespace="kube-system",
                                           conf_dir=conf_dir, get_nad=Nads())
    assert (name, json.loads(conf)["type"], resource) == ("n", "bridge", "")
    assert resolve_network("n", multus_namespace="kube-system", conf_dir=conf_dir,
                           get_nad=None)[0] == "n"  # no Kubernetes: the file alone


def test_an_unreachable_api_is_raised_only_when_no_file_has_the_name(conf_dir):
    def down(namespace, name):
        raise TryAgainLater("the API server is down")

    write(f"{conf_dir}/10-n.conf", {"name": "n", "type": "bridge"})
    assert resolve_network("n", multus_namespace="kube-system", conf_dir=conf_dir,
                           get_nad=down)[0] == "n"
    with pytest.raises(TryAgainLater, match="down"):
        resolve_network("other", multus_namespace="kube-system", conf_dir=conf_dir,
                        get_nad=down)


def test_a_nad_without_a_name_gets_the_nads_and_an_empty_spec_names_a_file(conf_dir):
    conf = nad_config(Nad("test", "mynad", '{"cniVersion":"0.3.1","type":"bridge"}'), conf_dir)
    assert json.loads(conf)["name"] == "mynad"
    write(f"{conf_dir}/10-f.conf", {"name": "mynad", "type": "ptp"})
    assert json.loads(nad_config(Nad("test", "mynad", ""), conf_dir))["type"] == "ptp"
    with pytest.raises(InvalidNetworkConfig, match="has an empty spec and no file"):
        nad_config(Nad("test", "other", ""), conf_dir)


def test_chained_conflist_counts_inline_and_chained_plugins(tmp_path):
    write(tmp_path / "aux" / "50-tuning.conf", {"type": "tuning"})
    skeleton = b'{"cniVersion":"1.0.0","name":"aux","plugins":[{"type":"passthru"}]}'
    conf, count = chained_conflist(skeleton, "the aux chain", str(tmp_path))
    assert count == 2
    assert [p["type"] for p in json.loads(conf)["plugins"]] == ["passthru", "tuning"]


def test_small_readers_of_a_config():
    assert network_name(b'{"name":"x"}') == "x" and network_name(b"[1]") == ""
    assert nad_resource_name(Nad("t", "n", "", {"k8s.v1.cni.cncf.io/resourceName": "r"})) == "r"
    assert nad_resource_name(Nad("t", "n", "")) == ""
    check_delegate_conf(b'{"plugins":[{"type":"bridge"}]}', "here")
    with pytest.raises(InvalidNetworkConfig, match="here: the CNI config is not valid JSON"):
        check_delegate_conf(b"{", "here")


@pytest.mark.parametrize("config, fragment", [
    ('{"type": "bridge", "mtu": NaN}', "NaN is not JSON"),
    ('{"type": "bridge", "mtu": Infinity}', "Infinity is not JSON"),
    ('{"type": "bridge", "mtu": 1e400}', "out of range"),
    ('{"type": "bridge", "x": ' + "[" * 10001 + "]" * 10001 + "}", "exceeded max depth"),
    ('\ufeff{"type": "bridge"}', "byte order mark"),
])
def test_a_nad_config_upstreams_decoder_refuses_is_an_invalid_config(conf_dir, config, fragment):
    with pytest.raises(InvalidNetworkConfig, match=fragment):
        nad_config(Nad("test", "n", config), conf_dir)


def test_a_nad_config_with_a_lone_surrogate_is_read_as_go_reads_it(conf_dir):
    """Go decodes an unpaired \\ud800 as U+FFFD: the config named after the NAD is valid UTF-8
    JSON (it raised UnicodeEncodeError)."""
    conf = nad_config(Nad("test", "n", '{"type": "bridge", "bridge": "\\ud800"}'), conf_dir)
    assert json.loads(conf) == {"name": "n", "type": "bridge", "bridge": "\ufffd"}


def test_a_delegate_config_is_checked_as_upstreams_netconf_structs_read_it():
    check_delegate_conf(b'{"Type": "bridge"}', "here")
    check_delegate_conf(b'{"Plugins": [{"TYPE": "bridge"}]}', "here")
    assert network_name(b'{"Name": "x", "type": "bridge"}') == "x"
    check_delegate_conf(b'{"type": "bridge", "type": null}', "here")  # null: no effect
    with pytest.raises(InvalidNetworkConfig, match="must have the 'type' or 'plugin' field"):
        check_delegate_conf(b'{"type": null, "plugins": [{"type": "x"}], "plugins": null}',
                            "here")
