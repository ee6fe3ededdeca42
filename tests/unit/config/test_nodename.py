"""multusd.config.nodename: the order of the four sources of the node name."""

from __future__ import annotations

from multusd.config.nodename import resolve


def never() -> str:
    raise AssertionError("not to be asked")


def test_key_first():
    found = resolve(" node-a ", {"MULTUS_NODE_NAME": "env"}, never, never)
    assert (found.name, found.source) == ("node-a", "nodeName in daemon-config.json")
    assert found.describe() == 'node name "node-a" from nodeName in daemon-config.json'


def test_environment_second():
    found = resolve("", {"MULTUS_NODE_NAME": "Node-B"}, never, never)
    assert (found.name, found.source) == ("Node-B", "MULTUS_NODE_NAME")


def test_certificate_third():
    found = resolve("", {"MULTUS_NODE_NAME": " "}, lambda: "node-c", never)
    assert found.name == "node-c" and "client certificate" in found.source


def test_host_name_last_lowercased():
    found = resolve("", {}, lambda: None, lambda: "Host-D.Example\n")
    assert found.name == "host-d.example" and "host name" in found.source
    assert resolve("", {}, None, lambda: "E").name == "e"
