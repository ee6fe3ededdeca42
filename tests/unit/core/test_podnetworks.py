"""multusd.core.podnetworks: which delegates a pod gets (cluster network, defaultNetworks,
NADs, the default-network annotation, default-route marks, the auxiliary chain).

Conf files are real files under tmp_path; NADs come from a dict behind the NadGetter seam
(the only stand-in: Kubernetes itself).
"""

from __future__ import annotations

import json
import os

import pytest

from multusd.core.delegate import Delegate
from multusd.core.podnetworks import (NadNotFound, add_device_id, build_delegates,
                                      mark_gateway_filters, selection_delegate)
from multusd.core.selection import parse_selections
from multusd.core.settings import load_settings
from multusd.errors import InvalidNetworkConfig, TryAgainLater

from nads import BRIDGE, MACVLAN, Nad, Nads, write

NETWORKS = "k8s.v1.cni.cncf.io/networks"
DEFAULT_NETWORK = "v1.multus-cni.io/default-network"


def build(netconf, annotations=None, nads=None, namespace="test", **kw):
    return build_delegates(load_settings(netconf), pod_namespace=namespace, pod_name="mypod",
                           annotations=annotations, cni_ifname="eth0",
                           get_nad=nads if nads is not None else Nads(), **kw)


def summary(delegates):
    return [(d.name, d.ifname, d.master) for d in delegates]


# --- delegates mode ------------------------------------------------------------------------


def test_delegates_mode_first_is_master():
    delegates = build({"delegates": [BRIDGE, {"type": "macvlan", "name": "mv"}]},
                      annotations=None, nads=None)
    assert summary(delegates) == [("cbr0", "eth0", True), ("mv", "net1", False)]
    # Upstream re-encodes inline delegates through a Go map: sorted keys.
    assert delegates[1].conf == b'{"name":"mv","type":"macvlan"}'


@pytest.mark.parametrize("delegate, expected", [
    ({"name": "x"}, "delegate must have the 'type' or 'plugin' field"),
    ({"name": "x", "plugins": [{"name": "p"}]}, "a plugin delegate must have the 'type' field"),
])
def test_delegates_mode_errors(delegate, expected):
    with pytest.raises(InvalidNetworkConfig) as err:
        build({"delegates": [BRIDGE, delegate]})
    assert "failed to load delegate 1 config" in err.value.msg and expected in err.value.msg


def test_default_network_annotation_replaces_master_in_delegates_mode():
    nads = Nads(Nad("kube-system", "alt", '{"cniVersion":"0.3.1","type":"bridge"}'))
    delegates = build({"delegates": [BRIDGE]}, {DEFAULT_NETWORK: "alt"}, nads)
    assert summary(delegates) == [("kube-system/alt", "eth0", True)]
    # The NAD had no name: the NAD's name is injected (and the JSON re-encoded sorted).
    assert delegates[0].conf == b'{"cniVersion":"0.3.1","name":"alt","type":"bridge"}'


# --- clusterNetwork ------------------------------------------------------------------------


def test_cluster_network_from_a_nad_in_multus_namespace(conf_dir):
    nads = Nads(Nad("kube-system", "mynet", json.dumps(BRIDGE)))
    (master,) = build({"clusterNetwork": "mynet", "confDir": conf_dir}, {}, nads)
    assert (master.name, master.ifname, master.master) == ("kube-system/mynet", "eth0", True)
    assert master.conf == json.dumps(BRIDGE).encode()  # a named config is used as written


def test_cluster_network_from_a_conf_named_in_conf_dir(conf_dir):
    write(f"{conf_dir}/05-other.conf", {"name": "other", "type": "ptp"})
    path = write(f"{conf_dir}/10-b.json", BRIDGE)
    nads = Nads()
    (master,) = build({"clusterNetwork": "cbr0", "confDir": conf_dir}, {}, nads)
    assert nads.lookups == [("kube-system", "cbr0")]
    assert master.name == "cbr0" and master.conf == open(path, "rb").read()


def test_cluster_network_name_falls_back_to_file_when_the_api_fails(conf_dir):
    write(f"{conf_dir}/10-b.conf", BRIDGE)

    def api_down(namespace, name):
        raise TryAgainLater("apiserver unreachable")

    (master,) = build({"clusterNetwork": "cbr0", "confDir": conf_dir}, {}, api_down)
    assert master.name == "cbr0"
    with pytest.raises(TryAgainLater, match="failed to get clusterNetwork 'nope'.*unreachable"):
        build({"clusterNetwork": "nope", "confDir": conf_dir}, {}, api_down)


def test_cluster_network_from_a_directory_takes_its_first_file(tmp_path):
    directory = tmp_path / "net.d"
    write(directory / "20-z.conf", {"name": "z", "type": "ptp"})
    write(directory / "10-a.json", BRIDGE)
    (master,) = build({"clusterNetwork": str(directory)}, {})
    assert master.name == "cbr0"  # lexically first of .conf/.json/.conflist; name unchecked


def test_cluster_network_from_a_conflist_with_subdirectory_chain(tmp_path):
    path = write(tmp_path / "net.d" / "10-mynet.conflist",
                 '{"name":"mynet","cniVersion":"1.0.0","x-vendor":{"b":1,"a":2},'
                 '"plugins":[{"type":"bridge",'
                 '"ipam":{"type":"host-local","subnet":"10.1.0.0/24"}}]}')
    write(tmp_path / "net.d" / "mynet" / "50-tuning.conf",
          '{"type":"tuning","sysctl":{"z":"1","a":"2"},"kubernetes":{"kubeconfig":"/k"}}')
    write(tmp_path / "net.d" / "mynet" / "60-ignored.json", {"type": "x"})
    (master,) = build({"clusterNetwork": path}, {})
    assert master.name == "mynet" and master.is_conflist
    # Upstream's lossless bytes: list keys sorted, inline plugins sorted, chained kept as is.
    assert master.conf == (
        b'{"cniVersion":"1.0.0","name":"mynet","plugins":[{"ipam":{"subnet":"10.1.0.0/24",'
        b'"type":"host-local"},"type":"bridge"},{"type":"tuning","sysctl":{"z":"1","a":"2"},'
        b'"kubernetes":{"kubeconfig":"/k"}}],"x-vendor":{"b":1,"a":2}}')


def test_cluster_network_errors_name_the_value_and_namespace(tmp_path, conf_dir):
    with pytest.raises(InvalidNetworkConfig) as err:
        build({"clusterNetwork": "nope", "confDir": conf_dir}, {})
    assert "failed to get clusterNetwork 'nope' in namespace 'kube-system'" in err.value.msg
    assert "no network-attachment-definition kube-system/nope" in err.value.msg
    with pytest.raises(InvalidNetworkConfig, match="does not exist"):
        build({"clusterNetwork": str(tmp_path / "missing.conf")}, {})
    os.makedirs(str(tmp_path / "empty"))
    with pytest.raises(InvalidNetworkConfig, match="without any .conf or .conflist"):
        build({"clusterNetwork": str(tmp_path / "empty")}, {})


# --- defaultNetworks -----------------------------------------------------------------------


def test_default_networks_follow_master_except_in_system_namespaces(conf_dir):
    write(f"{conf_dir}/10-b.conf", BRIDGE)
    nads = Nads(Nad("kube-system", "extra", MACVLAN))
    netconf = {"clusterNetwork": "cbr0", "defaultNetworks": ["extra"], "confDir": conf_dir}
    assert summary(build(netconf, {}, nads)) == [("cbr0", "eth0", True),
                                                 ("kube-system/extra", "net1", False)]
    assert summary(build(netconf, {}, nads, namespace="kube-system")) == [("cbr0", "eth0", True)]
    # No pod (annotations None): no defaultNetworks either, as upstream.
    assert summary(build(netconf, None, nads)) == [("cbr0", "eth0", True)]
    with pytest.raises(InvalidNetworkConfig, match="failed to get defaultNetworks entry 'gone'"):
        build(dict(netconf, defaultNetworks=["gone"]), {}, nads)


# --- pod selections ------------------------------------------------------------------------


@pytest.fixture
def cluster(conf_dir):
    write(f"{conf_dir}/10-b.conf", BRIDGE)
    return {"clusterNetwork": "cbr0", "confDir": conf_dir}


def test_annotation_networks_get_positional_names_and_requests_win(cluster):
    nads = Nads(Nad("test", "net1", MACVLAN), Nad("other", "net2", MACVLAN))
    delegates = build(cluster, {NETWORKS: "net1, other/net2@fast0, net1"}, nads)
    assert summary(delegates) == [("cbr0", "eth0", True), ("test/net1", "net1", False),
                                  ("other/net2", "fast0", False), ("test/net1", "net3", False)]
    assert delegates[2].ifname_request == "fast0" and delegates[2].selection.name == "net2"


def test_an_interface_name_used_twice_is_rejected(cluster):
    nads = Nads(Nad("test", "net1", MACVLAN))
    with pytest.raises(InvalidNetworkConfig) as err:
        build(cluster, {NETWORKS: "net1@net2,net1"}, nads)
    assert "interface name 'net2' would be used twice" in err.value.msg
    with pytest.raises(InvalidNetworkConfig, match="'eth0' would be used twice"):
        build(cluster, {NETWORKS: "net1@eth0"}, nads)


def test_missing_nad_raises_nad_not_found_with_event_text(cluster):
    with pytest.raises(NadNotFound) as err:
        build(cluster, {NETWORKS: "net1"}, Nads())
    assert (err.value.namespace, err.value.nad_name) == ("test", "net1")
    assert err.value.event_message == (
        "cannot find a network-attachment-definition (net1) in namespace (test): "
        'network-attachment-definitions.k8s.cni.cncf.io "net1" not found')
    assert err.value.code == 7


def test_selections_without_a_kubernetes_client_are_an_error(cluster):
    with pytest.raises(InvalidNetworkConfig, match="no Kubernetes client"):
        build_delegates(load_settings(cluster), pod_namespace="test", pod_name="p",
                        annotations={NETWORKS: "net1"}, cni_ifname="eth0", get_nad=None)


def test_namespace_isolation(cluster):
    nads = Nads(Nad("kube-system", "net1", MACVLAN), Nad("default", "net1", MACVLAN))
    isolated = dict(cluster, namespaceIsolation=True)
    with pytest.raises(InvalidNetworkConfig) as err:
        build(isolated, {NETWORKS: "kube-system/net1"}, nads)
    assert ("namespace isolation enabled, annotation violates permission, pod is in namespace "
            "test but refers to target namespace kube-system") in err.value.msg
    assert len(build(isolated, {NETWORKS: "default/net1"}, nads)) == 2
    allowed = dict(isolated, globalNamespaces="kube-system,x")
    assert len(build(allowed, {NETWORKS: "kube-system/net1"}, nads)) == 2


def test_default_network_annotation_uses_multus_namespace_and_may_rename(cluster):
    nads = Nads(Nad("kube-system", "alt", MACVLAN), Nad("test", "alt", "{}"))
    delegates = build(cluster, {DEFAULT_NETWORK: "alt@primary"}, nads)
    assert summary(delegates) == [("kube-system/alt", "primary", True)]
    assert nads.lookups[-1] == ("kube-system", "alt")  # not the pod's namespace


def test_nad_with_empty_spec_uses_the_conf_dir_file_of_its_name(cluster, conf_dir):
    write(f"{conf_dir}/20-net1.conflist", {"cniVersion": "1.0.0", "name": "net1",
                                           "plugins": [{"type": "macvlan"}]})
    nads = Nads(Nad("test", "net1", ""), Nad("test", "ghost", ""))
    delegates = build(cluster, {NETWORKS: "net1"}, nads)
    assert delegates[1].name == "test/net1" and delegates[1].is_conflist
    with pytest.raises(InvalidNetworkConfig, match="has an empty spec and no file"):
        build(cluster, {NETWORKS: "ghost"}, nads)


def test_cni_args_and_device_id_are_injected_into_the_executed_conf(cluster):
    nads = Nads(Nad("test", "sriov", '{"cniVersion":"1.0.0","name":"sriov","type":"sriov"}',
                    {"k8s.v1.cni.cncf.io/resourceName": "intel.com/sriov"}))
    allocated = iter(["0000:03:00.1", "0000:03:00.2"])
    delegates = build(cluster, {NETWORKS: '[{"name":"sriov","cni-args":{"a":"b"}},'
                                          '{"name":"sriov","deviceID":"mine"}]'},
                      nads, device_id_for=lambda resource: next(allocated))
    first, second = delegates[1], delegates[2]
    assert json.loads(first.conf) == {"cniVersion": "1.0.0", "name": "sriov", "type": "sriov",
                                      "deviceID": "0000:03:00.1", "pciBusID": "0000:03:00.1",
                                      "args": {"cni": {"a": "b"}}}
    assert first.device_id == "0000:03:00.1" and first.resource_name == "intel.com/sriov"
    # The kubelet's allocation wins over the pod's own deviceID request.
    assert second.device_id == "0000:03:00.2"


def test_a_selection_added_to_a_running_pod_is_its_nads_delegate_named_as_asked(cluster):
    nads = Nads(Nad("test", "net1", MACVLAN))
    (selection,) = parse_selections(
        '[{"name":"net1","interface":"hot0","mac":"c2:11:22:33:44:55","ips":["10.1.1.5/24"],'
        '"cni-args":{"a":"b"},"deviceID":"0000:03:00.7","default-route":["10.1.1.1"]}]', "test")
    delegate = selection_delegate(load_settings(cluster), selection, pod_namespace="test",
                                  pod_name="mypod", get_nad=nads)
    assert (delegate.name, delegate.ifname, delegate.master) == ("test/net1", "hot0", False)
    assert (delegate.mac_request, delegate.ip_request) == ("c2:11:22:33:44:55",
                                                          ("10.1.1.5/24",))
    assert delegate.device_id == "0000:03:00.7"
    assert json.loads(delegate.conf)["args"] == {"cni": {"a": "b"}}
    assert delegate.gateway_request is None  # the pod's other attachments keep their routes


def test_a_selection_added_to_a_running_pod_keeps_the_namespace_and_nad_rules(cluster):
    isolated = load_settings(dict(cluster, namespaceIsolation=True))
    (other,) = parse_selections("kube-system/net1@hot0", "test")
    with pytest.raises(InvalidNetworkConfig, match="namespace isolation enabled"):
        selection_delegate(isolated, other, pod_namespace="test", pod_name="p",
                           get_nad=Nads(Nad("kube-system", "net1", MACVLAN)))
    (ghost,) = parse_selections("ghost@hot0", "test")
    with pytest.raises(NadNotFound):
        selection_delegate(load_settings(cluster), ghost, pod_namespace="test", pod_name="p",
                           get_nad=Nads())


def test_add_device_id_to_every_plugin_of_a_conflist():
    out = json.loads(add_device_id(b'{"name":"l","plugins":[{"type":"a"},{"type":"b"}]}', "d"))
    assert [p["pciBusID"] for p in out["plugins"]] == ["d", "d"]


# --- default-route -------------------------------------------------------------------------


def test_default_route_marks_filters_on_every_other_delegate(cluster):
    nads = Nads(Nad("test", "net1", MACVLAN), Nad("test", "net2", MACVLAN))
    delegates = build(cluster, {NETWORKS: '[{"name":"net1","default-route":["10.1.1.254"]},'
                                          '{"name":"net2"}]'}, nads)
    assert [(d.filter_v4_gateway, d.filter_v6_gateway) for d in delegates] == [
        (True, True), (False, True), (True, True)]
    plain = build(cluster, {NETWORKS: "net1"}, nads)
    assert not any(d.filter_v4_gateway or d.filter_v6_gateway for d in plain)


def test_empty_default_route_filters_everything_and_v6_is_counted_apart(cluster):
    nads = Nads(Nad("test", "net1", MACVLAN), Nad("test", "net2", MACVLAN))
    delegates = build(cluster, {NETWORKS: '[{"name":"net1","default-route":[]},'
                                          '{"name":"net2","default-route":["fd00::1"]}]'}, nads)
    assert [(d.filter_v4_gateway, d.filter_v6_gateway) for d in delegates] == [
        (True, True), (True, True), (True, False)]


def test_ecmp_default_route_is_rejected(cluster):
    nads = Nads(Nad("test", "net1", MACVLAN), Nad("test", "net2", MACVLAN))
    with pytest.raises(InvalidNetworkConfig) as err:
        build(cluster, {NETWORKS: '[{"name":"net1","default-route":["10.1.1.254"]},'
                                  '{"name":"net2","default-route":["10.2.2.254"]}]'}, nads)
    assert err.value.msg.startswith("multus does not support ECMP for default-route")
    assert "10.1.1.254 (test/net1)" in err.value.msg
    with pytest.raises(InvalidNetworkConfig, match="ECMP"):
        mark_gateway_filters([Delegate(name="a", conf=b"{}", ifname="", master=False,
                                       gateway_request=("10.0.0.1", "::ffff:10.0.0.2"))])


# --- auxiliary chain -----------------------------------------------------------------------


def test_auxiliary_chain_is_appended_last_with_a_positional_name(tmp_path):
    primary = write(tmp_path / "net.d" / "10-b.conf", BRIDGE)
    write(tmp_path / "net.d" / "aux" / "10-tuning.conf",
          '{"type":"tuning","sysctl":{"net.ipv4.conf.eth0.arp_filter":"1"}}')
    delegates = build({"clusterNetwork": primary, "cniVersion": "0.4.0",
                       "auxiliaryCNIChainName": "aux"}, {})
    assert summary(delegates) == [("cbr0", "eth0", True), ("aux", "net1", False)]
    assert delegates[1].conf == (
        b'{"cniVersion":"0.4.0","name":"aux","plugins":[{"name":"passthru-cni",'
        b'"type":"passthru"},{"type":"tuning","sysctl":{"net.ipv4.conf.eth0.arp_filter":"1"}}]}')


def test_auxiliary_chain_without_plugins_is_skipped_and_needs_a_path(tmp_path, cluster):
    primary = write(tmp_path / "net.d" / "10-b.conf", BRIDGE)
    assert len(build({"clusterNetwork": primary, "auxiliaryCNIChainName": "aux"}, {})) == 1
    with pytest.raises(InvalidNetworkConfig, match="ClusterNetwork must be a path"):
        build(dict(cluster, auxiliaryCNIChainName="aux"), {})
    with pytest.raises(InvalidNetworkConfig, match="invalid network config name"):
        build({"clusterNetwork": primary, "auxiliaryCNIChainName": "../up"}, {})
