"""The engine with Debian's real CNI plugins (bridge, host-local, tuning) in real netns.

host-local always gets a ``dataDir`` under the test's tmp dir, so no lease lands in
/var/lib/cni; every namespace and bridge is removed by the conftest fixtures.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
from typing import Dict, List

import pytest

from testlib import PLUGIN_DIR, netns_links, netns_routes, run, unique
from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.errors import MultusError, PluginError

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

STUBS = os.path.join(os.path.dirname(__file__), "..", "stubs")


@pytest.fixture
def subnet() -> str:
    """A /24 unlikely to be in use by a parallel test: 10.<200-249>.<0-255>.0/24."""
    return f"10.{random.randint(200, 249)}.{random.randint(0, 255)}"


@pytest.fixture
def record_bin(tmp_path) -> str:
    bin_dir = tmp_path / "stubbin"
    bin_dir.mkdir()
    shutil.copyfile(os.path.join(STUBS, "stub-record"), bin_dir / "stub-record")
    os.chmod(bin_dir / "stub-record", 0o755)
    return str(bin_dir)


def bridge_conf(name: str, bridge: str, subnet: str, ipam_dir: str,
                version: str = "1.0.0") -> dict:
    return {"cniVersion": version, "name": name, "type": "bridge", "bridge": bridge,
            "isGateway": True,
            "ipam": {"type": "host-local", "subnet": f"{subnet}.0/24", "dataDir": ipam_dir,
                     "routes": [{"dst": "0.0.0.0/0"}]}}


def lease_files(ipam_dir: str, net_name: str) -> List[str]:
    directory = os.path.join(ipam_dir, net_name)
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if f[0].isdigit())


def rt(container_id: str, netns: str, cache_dir: str, **kw) -> RuntimeConf:
    return RuntimeConf(container_id=container_id, netns=netns, ifname="eth0",
                       args=(("IgnoreUnknown", "true"), ("K8S_POD_NAMESPACE", "default"),
                             ("K8S_POD_NAME", container_id)),
                       cache_dir=cache_dir, **kw)


def test_bridge_host_local_add_check_del(netns, bridge_name, cni_state, subnet):
    name = unique("br-")
    net = NetworkConfigList.load(bridge_conf(name, bridge_name, subnet, cni_state["ipam_dir"]))
    engine = Engine([PLUGIN_DIR])
    attachment = rt(unique("c"), netns, cni_state["cache_dir"])

    result = engine.add(net, attachment)
    address = result["ips"][0]["address"]
    assert address.startswith(f"{subnet}.") and address.endswith("/24")
    assert address in netns_links(netns)["eth0"]
    default = [r for r in netns_routes(netns) if r["dst"] == "default"]
    assert default and default[0]["gateway"] == f"{subnet}.1"
    assert lease_files(cni_state["ipam_dir"], name) == [address.split("/")[0]]
    assert resultcache.read_result(cni_state["cache_dir"], name, attachment.container_id,
                                   "eth0") == result

    engine.check(net, attachment)

    engine.delete(net, attachment)
    assert "eth0" not in netns_links(netns)
    assert lease_files(cni_state["ipam_dir"], name) == []
    assert resultcache.read(cni_state["cache_dir"], name, attachment.container_id, "eth0") is None


def test_check_notices_a_missing_interface(netns, bridge_name, cni_state, subnet):
    name = unique("br-")
    net = NetworkConfigList.load(bridge_conf(name, bridge_name, subnet, cni_state["ipam_dir"]))
    engine = Engine([PLUGIN_DIR])
    attachment = rt(unique("c"), netns, cni_state["cache_dir"])
    engine.add(net, attachment)
    run("ip", "-n", os.path.basename(netns), "link", "del", "eth0")
    with pytest.raises(PluginError) as err:
        engine.check(net, attachment)
    assert "eth0" in err.value.msg
    engine.delete(net, attachment)
    assert lease_files(cni_state["ipam_dir"], name) == []


def test_conflist_bridge_tuning_chain_and_reverse_del(netns, bridge_name, cni_state, subnet,
                                                     record_bin, tmp_path):
    name = unique("chain-")
    record = str(tmp_path / "calls.jsonl")
    conflist = {"cniVersion": "1.0.0", "name": name, "plugins": [
        bridge_conf(name, bridge_name, subnet, cni_state["ipam_dir"]),
        {"type": "tuning", "capabilities": {"mac": True},
         "sysctl": {"net.ipv4.conf.eth0.arp_filter": "1"}},
        {"type": "stub-record", "recordFile": record},
    ]}
    net = NetworkConfigList.load(json.dumps(conflist).encode(), source="test conflist")
    engine = Engine([PLUGIN_DIR, record_bin])
    mac = "c2:11:22:33:44:66"
    attachment = rt(unique("c"), netns, cni_state["cache_dir"],
                    capability_args={"mac": mac, "portMappings": [{"hostPort": 8080}]})

    result = engine.add(net, attachment)
    ns = os.path.basename(netns)
    link = json.loads(run("ip", "-n", ns, "-j", "link", "show", "eth0").stdout)[0]
    assert link["address"] == mac  # tuning got runtimeConfig.mac
    sysctl = run("ip", "netns", "exec", ns, "cat",
                 "/proc/sys/net/ipv4/conf/eth0/arp_filter").stdout.strip()
    assert sysctl == "1"
    # the recording stub at the end saw the chained prevResult of bridge+tuning
    add_call = json.loads(open(record).read().splitlines()[0])
    prev = add_call["stdin"]["prevResult"]
    assert prev["ips"] == result["ips"]
    assert any(i.get("sandbox") == netns and i["name"] == "eth0" for i in prev["interfaces"])
    assert "runtimeConfig" not in add_call["stdin"]  # it declares no capabilities

    engine.check(net, attachment)
    engine.delete(net, attachment)
    commands = [json.loads(line)["command"] for line in open(record)]
    assert commands == ["ADD", "CHECK", "DEL"]
    assert lease_files(cni_state["ipam_dir"], name) == []
    assert "eth0" not in netns_links(netns)


def test_twenty_concurrent_adds_then_dels(make_netns, bridge_name, cni_state, subnet):
    name = unique("many-")
    net = NetworkConfigList.load(bridge_conf(name, bridge_name, subnet, cni_state["ipam_dir"]))
    engine = Engine([PLUGIN_DIR])
    attachments = [rt(unique("c"), make_netns(), cni_state["cache_dir"]) for _ in range(20)]
    results: Dict[str, dict] = {}
    errors: List[BaseException] = []

    def call(method, attachment) -> None:
        try:
            out = method(net, attachment)
            if out is not None:
                results[attachment.container_id] = out
        except BaseException as exc:  # asserted below
            errors.append(exc)

    def in_threads(method) -> None:
        threads = [threading.Thread(target=call, args=(method, a)) for a in attachments]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    in_threads(engine.add)
    assert errors == []
    addresses = {cid: r["ips"][0]["address"] for cid, r in results.items()}
    assert len(set(addresses.values())) == 20
    for attachment in attachments:
        ipv4 = [a for a in netns_links(attachment.netns)["eth0"] if ":" not in a]
        assert ipv4 == [addresses[attachment.container_id]]
    assert len(lease_files(cni_state["ipam_dir"], name)) == 20

    in_threads(engine.delete)
    assert errors == []
    assert lease_files(cni_state["ipam_dir"], name) == []
    assert resultcache.list_entries(cni_state["cache_dir"]) == []


def test_del_of_something_already_gone(make_netns, bridge_name, cni_state, subnet):
    name = unique("gone-")
    net = NetworkConfigList.load(bridge_conf(name, bridge_name, subnet, cni_state["ipam_dir"]))
    engine = Engine([PLUGIN_DIR])

    # never added: no netns, no cache, no lease
    never = rt(unique("c"), "/var/run/netns/" + unique("missing-"), cni_state["cache_dir"])
    engine.delete(net, never)

    # added, then the runtime removed the netns before DEL; then containerd's second DEL
    # with an empty CNI_NETNS and no cache left
    netns = make_netns()
    attachment = rt(unique("c"), netns, cni_state["cache_dir"])
    engine.add(net, attachment)
    run("ip", "netns", "del", os.path.basename(netns))
    engine.delete(net, attachment)
    assert lease_files(cni_state["ipam_dir"], name) == []
    engine.delete(net, rt(attachment.container_id, "", cni_state["cache_dir"]))


def test_missing_plugin_names_every_dir(netns, cni_state, tmp_path):
    net = NetworkConfigList.load({"cniVersion": "1.0.0", "name": "n", "type": "bridgeX"})
    dirs = [PLUGIN_DIR, str(tmp_path / "nothing-here")]
    with pytest.raises(MultusError) as err:
        Engine(dirs).add(net, rt(unique("c"), netns, cni_state["cache_dir"]))
    assert "'bridgeX'" in err.value.msg and all(d in err.value.msg for d in dirs)
