"""multusd.core.delegate: one attachment of a pod, what its config says, and its ifname."""

from __future__ import annotations

from multusd.core.delegate import Delegate, ifname_for


def delegate(conf: bytes, **fields) -> Delegate:
    return Delegate(name="n", conf=conf, ifname="", master=False, **fields)


def test_the_interface_name_is_the_request_then_cni_ifname_for_the_master_then_net_index():
    assert ifname_for(delegate(b"{}", ifname_request="fast0"), "eth0", 3) == "fast0"
    assert ifname_for(Delegate(name="m", conf=b"{}", ifname="", master=True), "eth9", 0) == "eth9"
    assert ifname_for(delegate(b"{}"), "eth0", 2) == "net2"


def test_a_conf_and_a_conflist_say_their_name_and_plugin_type():
    conf = delegate(b'{"name":"a","type":"bridge"}')
    assert (conf.is_conflist, conf.conf_name, conf.plugin_type) == (False, "a", "bridge")
    conflist = delegate(b'{"name":"l","plugins":[{"type":"ptp"},{"type":"tuning"}]}')
    assert (conflist.is_conflist, conflist.conf_name, conflist.plugin_type) == \
        (True, "l", "ptp")


def test_a_config_that_does_not_parse_has_no_name_and_no_type():
    for raw in (b"{", b"[1]", b'{"name":3,"plugins":["x"]}'):
        broken = delegate(raw)
        assert (broken.conf_name, broken.plugin_type) == ("", "")
