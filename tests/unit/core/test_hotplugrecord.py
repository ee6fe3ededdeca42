"""multusd.core.hotplugrecord: dynamic attachments kept in the scratch cache, upstream-readable."""

from __future__ import annotations

import json

import pytest

from multusd.core import scratch
from multusd.core.delegate import Delegate
from multusd.core.hotplugrecord import (ADDED, ADDING, HOTPLUG_KEY, MAX_REMOVED, REMOVED_KEY,
                                        HotplugMark, Removal, ScratchEntries, read_marks)
from multusd.errors import DecodeFailure

CLUSTER = Delegate(name="cluster-net", conf=b'{"cniVersion":"0.4.0","name":"cluster-net",'
                   b'"type":"bridge"}', ifname="eth0", master=True)


def nad(name: str, ifname: str = "", requested: str = "") -> Delegate:
    conf = json.dumps({"cniVersion": "0.4.0", "name": name, "type": "bridge"}).encode()
    return Delegate(name=f"default/{name}", conf=conf, ifname=ifname, master=False,
                    ifname_request=requested)


# An entry as upstream v4.3 writes it for a conflist from a file: its CNINetworkConfigList
# holds the executed plugins, which a rebuild from our Delegate would not keep.
UPSTREAM_ENTRY = ('{"Conf":{"cniVersion":"0.4.0","name":"cluster-net","type":"bridge","ipam":{}'
                  ',"dns":{}},"ConfList":{},"CNINetworkConfigList":{"Name":"cluster-net",'
                  '"CNIVersion":"0.4.0","DisableCheck":false,"DisableGC":false,'
                  '"LoadOnlyInlinedPlugins":false,"Plugins":[{"Network":{"type":"bridge"},'
                  '"Bytes":"eyJ0eXBlIjoiYnJpZGdlIiwiYnJpZGdlIjoiY25pMCJ9"}],"Bytes":null},'
                  '"Name":"cluster-net","IsFilterV4Gateway":false,"IsFilterV6Gateway":false,'
                  '"Bytes":"e30="}')


def test_the_entries_other_daemons_wrote_stay_byte_for_byte():
    data = ("[" + UPSTREAM_ENTRY + "]").encode()
    entries = ScratchEntries.parse(data)
    entries.append(nad("a", "hot0", "hot0"), HotplugMark(state=ADDING, since=5.0))
    written = entries.to_bytes()
    assert written.startswith(data[:-1] + b",")
    appended = json.loads(written)[1]
    assert appended[HOTPLUG_KEY] == {"state": "adding", "since": 5.0}
    assert appended == dict(scratch.cache_entry(nad("a", "hot0", "hot0")),
                            **{HOTPLUG_KEY: {"state": "adding", "since": 5.0}})


def test_upstreams_reader_and_ours_read_a_marked_cache_as_the_same_delegates():
    entries = ScratchEntries.parse(scratch.delegates_to_cache([CLUSTER, nad("a")]))
    entries.append(nad("b", "hot0", "hot0"), HotplugMark(state=ADDED, since=7.5))
    data = entries.to_bytes()
    delegates = scratch.delegates_from_cache(data)
    assert [(d.name, d.ifname) for d in delegates] == [("cluster-net", "eth0"),
                                                        ("default/a", "net1"),
                                                        ("default/b", "hot0")]
    marks, removed = read_marks(data)
    assert marks == [None, None, HotplugMark(state=ADDED, since=7.5)]
    assert removed == ()


def test_a_removal_pins_the_later_unnamed_interfaces_and_is_recorded():
    entries = ScratchEntries.parse(scratch.delegates_to_cache(
        [CLUSTER, nad("a"), nad("b"), nad("c", requested="data0")]))
    entries.drop(1, ["eth0", "net1", "net2", "data0"],
                 Removal(network="default/a", ifname="net1", at=9.0))
    data = entries.to_bytes()
    delegates = scratch.delegates_from_cache(data)
    assert [(d.name, d.ifname) for d in delegates] == [("cluster-net", "eth0"),
                                                        ("default/b", "net2"),
                                                        ("default/c", "data0")]
    second = json.loads(data)[1]
    assert list(second)[:5] == ["Conf", "ConfList", "CNINetworkConfigList", "Name",
                                "ifnameRequest"]  # upstream's field order
    assert json.loads(data)[0][REMOVED_KEY] == [{"name": "default/a", "interface": "net1",
                                                 "at": 9.0}]
    assert read_marks(data)[1] == (Removal(network="default/a", ifname="net1", at=9.0),)


def test_a_rolled_back_add_records_no_removal():
    entries = ScratchEntries.parse(scratch.delegates_to_cache([CLUSTER]))
    entries.append(nad("a", "hot0", "hot0"), HotplugMark(state=ADDING, since=1.0))
    entries.drop(1, ["eth0", "hot0"])
    assert entries.to_bytes() == scratch.delegates_to_cache([CLUSTER])


def test_the_removals_kept_are_bounded():
    entries = ScratchEntries.parse(scratch.delegates_to_cache([CLUSTER]))
    for number in range(MAX_REMOVED + 5):
        entries.append(nad("a", "hot0", "hot0"), HotplugMark(state=ADDED, since=1.0))
        entries.drop(1, ["eth0", "hot0"], Removal(network="default/a", ifname="hot0",
                                                  at=float(number)))
    kept = entries.removals()
    assert len(kept) == MAX_REMOVED
    assert kept[-1].at == MAX_REMOVED + 4 and kept[0].at == 5


def test_the_first_entry_is_never_dropped():
    entries = ScratchEntries.parse(scratch.delegates_to_cache([CLUSTER]))
    with pytest.raises(ValueError):
        entries.drop(0, ["eth0"])


@pytest.mark.parametrize("raw", [
    {"state": "done"}, "added", {"since": 1.0}, None])
def test_a_mark_that_does_not_parse_counts_as_the_sandbox_adds(raw):
    entry = dict(scratch.cache_entry(nad("a", "net1")), **{HOTPLUG_KEY: raw})
    data = scratch.encode_entries([scratch.cache_entry(CLUSTER), entry])
    assert read_marks(data)[0] == [None, None]


def test_malformed_removals_are_skipped_and_bytes_that_are_no_cache_give_nothing():
    first = dict(scratch.cache_entry(CLUSTER), **{REMOVED_KEY: [
        {"name": "default/a"}, "x", {"name": "default/b", "interface": "net2", "at": "?"}]})
    assert read_marks(scratch.encode_entries([first]))[1] == (
        Removal(network="default/b", ifname="net2", at=0.0),)
    assert read_marks(b"{not json") == ([], ())
    assert read_marks(None) == ([], ())
    with pytest.raises(DecodeFailure):
        ScratchEntries.parse(b'{"a": 1}')
