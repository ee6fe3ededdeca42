"""DRA lookups (multusd.kube.draclaims) through the real client against the stand-in API server.

ResourceClaims and this node's ResourceSlices as kube-apiserver serves them (tests/kubedra.py):
which devices a pod gets, which it does not (a GPU, another node's device of the same name, an
older pool generation, adminAccess), the errors that name the claim, and what it costs in
requests (none without claims, one GET per claim per ADD, one list per node and driver).
"""

from __future__ import annotations

import threading
import time

import pytest

from kubedra import gpu_device, network_device
from multusd.errors import DeadlineExceeded, MultusError
from multusd.kube.client import KubeClient
from multusd.kube.objects import pod_from_object

NS = "default"
SRIOV = "sriov.example.com"
GPU = "gpu.example.com"
RESOURCE = "example.com/sriov_vf"


@pytest.fixture
def client(kube_api):
    made = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    yield made
    made.stop()


def soon(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def claim_pod(kube_api, name: str, *claims: str, extended=None, direct=(), node=None):
    """A pod whose status names ``claims`` (generated from templates), as the Pod record."""
    status = {"resourceClaimStatuses": [{"name": f"c{i}", "resourceClaimName": c}
                                        for i, c in enumerate(claims)]}
    if extended is not None:
        status["extendedResourceClaimStatus"] = extended
    spec = {"resourceClaims": [{"name": f"d{i}", "resourceClaimName": c}
                               for i, c in enumerate(direct)]}
    return pod_from_object(kube_api.add_pod(NS, name, status=status, spec=spec, node=node))


def sriov_and_gpu(kube_api) -> None:
    """This node: two VFs and a GPU; node-b: VFs of the same names and pool, other IDs."""
    node = kube_api.node
    kube_api.add_resource_slice("a-sriov", node=node, driver=SRIOV, pool="pool-0", devices=[
        network_device("vf-0", "0000:03:00.1", RESOURCE, pfName="ens1f0"),
        network_device("vf-1", "0000:03:00.2", RESOURCE, pfName="ens1f0")])
    kube_api.add_resource_slice("b-sriov", node="node-b", driver=SRIOV, pool="pool-0", devices=[
        network_device("vf-0", "0000:81:00.1", RESOURCE),
        network_device("vf-1", "0000:81:00.2", RESOURCE)])
    kube_api.add_resource_slice("a-gpu", node=node, driver=GPU, pool="pool-0",
                                devices=[gpu_device("gpu-0")])


def test_a_pod_without_claims_costs_no_request(kube_api, client):
    pod = pod_from_object(kube_api.add_pod(NS, "plain"))
    before = client.api_requests
    assert client.pod_dra_devices(pod, deadline=soon()) == []
    assert client.api_requests == before and kube_api.dra_requests() == []


def test_an_sriov_device_and_a_gpu_in_one_claim_give_the_vf_of_this_node(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "web-net-x7k", [("vf", SRIOV, "pool-0", "vf-1"),
                                                     ("gpu", GPU, "pool-0", "gpu-0")])
    pod = claim_pod(kube_api, "web", "web-net-x7k")

    devices = client.pod_dra_devices(pod, deadline=soon())

    assert [(d.resource_name, d.device_id, d.claim, d.request, d.driver, d.pool, d.device)
            for d in devices] == [(RESOURCE, "0000:03:00.2", "web-net-x7k", "vf", SRIOV,
                                   "pool-0", "vf-1")]
    slices = kube_api.dra_requests("resourceslices")
    assert sorted(q["fieldSelector"] for _, _, q in slices) == [
        f"spec.nodeName={kube_api.node},spec.driver={GPU}",
        f"spec.nodeName={kube_api.node},spec.driver={SRIOV}"]
    assert [p for _, p, _ in kube_api.dra_requests("resourceclaims")] == [
        f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/web-net-x7k"]


def test_the_same_device_name_on_another_node_is_never_used(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "c-a", [("vf", SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "p", "c-a")
    assert [d.device_id for d in client.pod_dra_devices(pod, deadline=soon())] == \
        ["0000:03:00.1"]
    # only node-b publishes vf-7: not this node's, so skipped after one more list
    kube_api.add_resource_slice("b-sriov", node="node-b", driver=SRIOV, pool="pool-0",
                                devices=[network_device("vf-7", "0000:81:00.7", RESOURCE)])
    kube_api.add_resource_claim(NS, "c-b", [("vf", SRIOV, "pool-0", "vf-7")])
    lists = len(kube_api.dra_requests("resourceslices"))
    assert client.pod_dra_devices(claim_pod(kube_api, "q", "c-b"), deadline=soon()) == []
    assert len(kube_api.dra_requests("resourceslices")) == lists + 1  # the miss: one list


def test_slice_entries_no_add_uses_are_forgotten_once_stale(kube_api, client):
    """Pods of other nodes and drivers gone out of use do not pile up over the uptime."""
    from multusd.kube.draclaims import SliceCache

    sriov_and_gpu(kube_api)
    now = [0.0]
    cache = SliceCache(max_age=60.0, clock=lambda: now[0])

    def lookup(node: str, driver: str) -> None:
        cache.lookup(client.get_json, client.config, node, driver, "pool-0", "vf-0",
                     since=now[0], deadline=soon())

    for node in (kube_api.node, "node-b", "node-c"):
        for driver in (SRIOV, GPU):
            lookup(node, driver)
    assert cache.size() == 6 and cache.lists == 6
    now[0] = 30.0
    lookup(kube_api.node, SRIOV)  # fresh: served from the cache, nothing forgotten
    assert cache.size() == 6 and cache.lists == 6
    now[0] = 61.0
    lookup(kube_api.node, SRIOV)  # every entry is stale: only the one in use is kept
    assert cache.size() == 1 and cache.lists == 7


def test_slices_a_server_sends_for_another_node_or_driver_are_dropped():
    from multusd.kube.draclaims import SliceDevice, slice_devices

    def item(node, driver, pool, generation, device, device_id):
        return {"spec": {"nodeName": node, "driver": driver,
                         "pool": {"name": pool, "generation": generation},
                         "devices": [network_device(device, device_id, RESOURCE)]}}

    items = [item("node-a", SRIOV, "p", 2, "vf-0", "new"), item("node-a", SRIOV, "p", 1, "vf-1", "old"),
             item("node-b", SRIOV, "p", 3, "vf-0", "other-node"),
             item("node-a", GPU, "p", 3, "vf-0", "other-driver"),
             {"spec": "junk"}, "junk"]
    assert slice_devices(items, "node-a", SRIOV) == {("p", "vf-0"): SliceDevice("new", RESOURCE)}


def test_a_claim_not_allocated_is_an_error_naming_it(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "web-net-pending", None)
    pod = claim_pod(kube_api, "web", "web-net-pending")
    with pytest.raises(MultusError, match=r"ResourceClaim default/web-net-pending \(the pod's "
                       r"claim 'c0' of pod default/web\) has no device allocation"):
        client.pod_dra_devices(pod, deadline=soon())


def test_a_missing_claim_and_a_server_without_dra_name_the_claim(kube_api, client):
    pod = claim_pod(kube_api, "web", "gone-claim")
    with pytest.raises(MultusError, match="ResourceClaim default/gone-claim .* was not found"):
        client.pod_dra_devices(pod, deadline=soon())
    kube_api.serve_dra = False
    kube_api.add_resource_claim(NS, "gone-claim", [("vf", SRIOV, "pool-0", "vf-0")])
    with pytest.raises(MultusError, match="does not serve resource.k8s.io/v1"):
        client.pod_dra_devices(pod, deadline=soon())


@pytest.mark.parametrize("verb, resource", [("get", "resourceclaims"),
                                            ("list", "resourceslices")])
def test_a_forbidden_dra_request_names_the_grants(kube_api, client, verb, resource):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "c", [("vf", SRIOV, "pool-0", "vf-0")])
    kube_api.deny(verb, resource, group="resource.k8s.io")
    pod = claim_pod(kube_api, "web", "c")
    with pytest.raises(MultusError) as caught:
        client.pod_dra_devices(pod, deadline=soon())
    assert "403 Forbidden" in caught.value.msg
    assert "resourceclaims: get and resourceslices: list" in caught.value.msg


def test_two_devices_of_one_resource_and_a_direct_claim(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "gen", [("vf", SRIOV, "pool-0", "vf-1")])
    kube_api.add_resource_claim(NS, "shared", [("vf", SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "web", "gen", direct=["shared"])
    assert sorted(d.device_id for d in client.pod_dra_devices(pod, deadline=soon())) == \
        ["0000:03:00.1", "0000:03:00.2"]


def test_devices_without_both_attributes_and_admin_access_are_skipped(kube_api, client):
    kube_api.add_resource_slice("a", node=kube_api.node, driver=SRIOV, pool="p", devices=[
        network_device("no-id", None, RESOURCE), network_device("no-name", "0000:01:00.1", None),
        network_device("watched", "0000:01:00.2", RESOURCE),
        network_device("ok", "0000:01:00.3", RESOURCE)])
    kube_api.add_resource_claim(NS, "c", [("r", SRIOV, "p", "no-id"), ("r", SRIOV, "p", "no-name"),
                                          ("r", SRIOV, "p", "ok")])
    kube_api.add_resource_claim(NS, "monitor", [("r", SRIOV, "p", "watched")], adminAccess=True)
    pod = claim_pod(kube_api, "web", "c", "monitor")
    assert [d.device for d in client.pod_dra_devices(pod, deadline=soon())] == ["ok"]


def test_an_older_pool_generation_is_not_used(kube_api, client):
    kube_api.add_resource_slice("old", node=kube_api.node, driver=SRIOV, pool="p", generation=1,
                                devices=[network_device("vf-0", "0000:01:00.1", RESOURCE)])
    kube_api.add_resource_slice("new", node=kube_api.node, driver=SRIOV, pool="p", generation=2,
                                devices=[network_device("vf-0", "0000:02:00.1", RESOURCE)])
    kube_api.add_resource_claim(NS, "c", [("r", SRIOV, "p", "vf-0")])
    pod = claim_pod(kube_api, "web", "c")
    assert [d.device_id for d in client.pod_dra_devices(pod, deadline=soon())] == \
        ["0000:02:00.1"]


EXTENDED = {"resourceClaimName": "web-extended-resources-abc",
            "requestMappings": [{"containerName": "app", "resourceName": RESOURCE,
                                 "requestName": "container-0-request-0"}]}


def test_extended_resource_mapping_match(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, EXTENDED["resourceClaimName"], [
        ("container-0-request-0", SRIOV, "pool-0", "vf-0"),
        ("container-0-request-0", SRIOV, "pool-0", "vf-1")])
    pod = claim_pod(kube_api, "web", extended=EXTENDED)
    assert pod.extended_claim.mappings == (("app", RESOURCE, "container-0-request-0"),)
    devices = client.pod_dra_devices(pod, deadline=soon())
    assert [(d.resource_name, d.device_id) for d in devices] == [
        (RESOURCE, "0000:03:00.1"), (RESOURCE, "0000:03:00.2")]


@pytest.mark.parametrize("device, request_name, message", [
    (network_device("vf-0", "0000:03:00.1", "example.com/other"), "container-0-request-0",
     "has k8s.cni.cncf.io/resourceName 'example.com/other', but the pod's extended-resource "
     "mapping for request 'container-0-request-0' is 'example.com/sriov_vf'"),
    (network_device("vf-0", "0000:03:00.1", None), "container-0-request-0",
     "has no k8s.cni.cncf.io/resourceName attribute"),
    (network_device("vf-9", "0000:03:00.1", RESOURCE), "container-0-request-0",
     "is in no ResourceSlice of node 'node-a'"),
    (network_device("vf-0", "0000:03:00.1", RESOURCE), "another-request",
     "request 'container-0-request-0', which the pod's extendedResourceClaimStatus maps to "
     "resource 'example.com/sriov_vf', has no allocated device"),
], ids=["mismatch", "no-resource-name", "not-published", "no-such-request"])
def test_extended_resource_mapping_mismatch_is_an_error(kube_api, client, device, request_name,
                                                        message):
    kube_api.add_resource_slice("a", node=kube_api.node, driver=SRIOV, pool="pool-0",
                                devices=[device])
    kube_api.add_resource_claim(NS, EXTENDED["resourceClaimName"],
                                [(request_name, SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "web", extended=EXTENDED)
    with pytest.raises(MultusError) as caught:
        client.pod_dra_devices(pod, deadline=soon())
    assert message in caught.value.msg
    assert "ResourceClaim default/web-extended-resources-abc" in caught.value.msg


def test_claims_are_read_per_add_and_slices_once_per_node_and_driver(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "c1", [("vf", SRIOV, "pool-0", "vf-0")])
    kube_api.add_resource_claim(NS, "c2", [("vf", SRIOV, "pool-0", "vf-1")])
    first = claim_pod(kube_api, "one", "c1", "c2")
    assert len(client.pod_dra_devices(first, deadline=soon())) == 2
    assert len(client.pod_dra_devices(first, deadline=soon())) == 2
    assert len(kube_api.dra_requests("resourceclaims")) == 4  # each claim once per ADD
    assert len(kube_api.dra_requests("resourceslices")) == 1 == client.dra_slice_lists
    # the driver publishes a new device: the first ADD that needs it lists again
    kube_api.add_resource_slice("a-sriov", node=kube_api.node, driver=SRIOV, pool="pool-0",
                                devices=[network_device("vf-0", "0000:03:00.1", RESOURCE),
                                         network_device("vf-5", "0000:03:00.6", RESOURCE)])
    kube_api.add_resource_claim(NS, "c3", [("vf", SRIOV, "pool-0", "vf-5")])
    third = claim_pod(kube_api, "three", "c3")
    assert [d.device_id for d in client.pod_dra_devices(third, deadline=soon())] == \
        ["0000:03:00.6"]
    assert len(kube_api.dra_requests("resourceslices")) == 2


def test_concurrent_adds_share_one_slice_list(kube_api, client):
    sriov_and_gpu(kube_api)
    pods = []
    for i in range(6):
        kube_api.add_resource_claim(NS, f"c{i}", [("vf", SRIOV, "pool-0", f"vf-{i % 2}")])
        pods.append(claim_pod(kube_api, f"p{i}", f"c{i}"))
    results: dict = {}
    threads = [threading.Thread(target=lambda p=p: results.__setitem__(
        p.name, client.pod_dra_devices(p, deadline=soon()))) for p in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 6 and all(len(v) == 1 for v in results.values())
    assert len(kube_api.dra_requests("resourceslices")) == 1


def test_a_spent_deadline_sends_nothing(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "c", [("vf", SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "web", "c")
    with pytest.raises(DeadlineExceeded):
        client.pod_dra_devices(pod, deadline=time.monotonic() - 1)
    assert kube_api.dra_requests() == []


def test_the_stand_in_refuses_field_selectors_kube_apiserver_does_not_support(kube_api,
                                                                                client):
    with pytest.raises(client.config.request_errors()) as caught:
        client.get_json("/apis/resource.k8s.io/v1/resourceslices",
                        {"fieldSelector": "spec.pool.name=pool-0"})
    assert caught.value.status == 400
    assert client.get_json("/apis/resource.k8s.io/v1/resourceslices",
                           {"fieldSelector": "spec.driver=none"})["items"] == []


def test_a_server_error_is_translated_and_retried_by_the_runtime(kube_api, client):
    sriov_and_gpu(kube_api)
    kube_api.add_resource_claim(NS, "c", [("vf", SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "web", "c")
    kube_api.fail_next("GET", "/apis/resource.k8s.io/v1/resourceslices", 503, times=None)
    from multusd.errors import TryAgainLater
    with pytest.raises(TryAgainLater, match="list the ResourceSlices of driver"):
        client.pod_dra_devices(pod, deadline=soon(1.0))  # 503 until the deadline's end
    kube_api.clear_failures()
    # nothing half-cached: the next ADD lists again and finds the device
    assert [d.device for d in client.pod_dra_devices(pod, deadline=soon())] == ["vf-0"]


def test_objects_given_whole_as_a_driver_and_the_scheduler_write_them(kube_api, client):
    """The v1 shapes as written by hand: attributes of other types are not strings."""
    kube_api.add_resource_slice({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-sriov-8xk2p", "generateName": "node-a-sriov-"},
        "spec": {"driver": SRIOV, "nodeName": kube_api.node,
                 "pool": {"name": kube_api.node, "generation": 3, "resourceSliceCount": 1},
                 "devices": [
                     {"name": "0000-03-00-1", "attributes": {
                         "k8s.cni.cncf.io/deviceID": {"string": "0000:03:00.1"},
                         "k8s.cni.cncf.io/resourceName": {"string": RESOURCE},
                         "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
                         "sriovnetwork.k8snetworkplumbingwg.io/vfID": {"int": 1}}},
                     {"name": "0000-03-00-2", "attributes": {
                         "k8s.cni.cncf.io/deviceID": {"int": 2},
                         "k8s.cni.cncf.io/resourceName": {"string": RESOURCE}}}]}})
    kube_api.add_resource_claim(NS, "web-vf-q2w", [
        {"request": "vf", "driver": SRIOV, "pool": kube_api.node, "device": "0000-03-00-1"},
        {"request": "vf", "driver": SRIOV, "pool": kube_api.node, "device": "0000-03-00-2"}])
    pod = claim_pod(kube_api, "web", "web-vf-q2w")
    assert [(d.device, d.device_id) for d in client.pod_dra_devices(pod, deadline=soon())] == \
        [("0000-03-00-1", "0000:03:00.1")]
