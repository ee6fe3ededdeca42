"""multusd.kube.draclaims: the rules of one pod's DRA lookup and of the shared ResourceSlice cache.

The module is handed one request function, ``get_json(path, query, deadline=)``; here it is
:class:`GetJson`, which sends through the real transport to the stand-in API server
(tests/kubeapi.py, tests/kubedra.py). tests/integration/test_k8s_dra.py drives the same
module through ``KubeClient.pod_dra_devices`` (which devices count, the errors that name the
claim, what it costs in requests); this file pins the rules that one does not: the relist at
most once per ADD and key, the age of an entry, a claim named twice, malformed allocations,
what is logged for a skipped device, subrequests, the deadline while another ADD lists.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Iterator, Optional

import pytest

from kubeapi import FakeKubeAPI
from kubedra import gpu_device, network_device
from multusd.errors import DeadlineExceeded, MultusError, TryAgainLater
from multusd.kube import draclaims
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.draclaims import RBAC_HINT, SliceCache, SliceDevice, pod_devices, slice_devices
from multusd.kube.objects import Pod, pod_from_object
from testlib import wait_for

NS = "default"
SRIOV = "sriov.example.com"
RESOURCE = "example.com/sriov_vf"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/"


class GetJson:
    """The one request function draclaims is given, over a real transport."""

    def __init__(self, config: ClientConfig, timeout: float = 5.0) -> None:
        self.config, self.timeout = config, timeout

    def __call__(self, path: str, query: Any = None, *, deadline: Optional[float] = None) -> Any:
        timeout = self.timeout if deadline is None else deadline - time.monotonic()
        if timeout <= 0:
            raise DeadlineExceeded("the test's request had no time left")
        response = self.config.transport.request("GET", path, query=query, timeout=timeout)
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()


@pytest.fixture
def get_json(kube_api) -> Iterator[GetJson]:
    config = ClientConfig(kube_api.kubeconfig_path)
    yield GetJson(config)
    config.close()


def soon(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def devices_of(pod: Pod, get_json: GetJson, cache: Optional[SliceCache] = None, *,
               node: str = "node-a", deadline: Optional[float] = None) -> list:
    return pod_devices(pod, get_json, get_json.config, cache or SliceCache(), node=node,
                       deadline=deadline or soon())


def claim_pod(api: FakeKubeAPI, name: str, *claims: str, extended: Any = None) -> Pod:
    status: dict = {"resourceClaimStatuses": [{"name": f"c{i}", "resourceClaimName": c}
                                              for i, c in enumerate(claims)]}
    if extended is not None:
        status["extendedResourceClaimStatus"] = extended
    return pod_from_object(api.add_pod(NS, name, status=status))


def vfs(api: FakeKubeAPI, *names: str, node: str = "node-a") -> None:
    api.add_resource_slice(f"{node}-sriov", node=node, driver=SRIOV, pool="pool-0", devices=[
        network_device(name, f"0000:03:00.{i}", RESOURCE) for i, name in enumerate(names)])


def lists(api: FakeKubeAPI) -> int:
    return len(api.dra_requests("resourceslices"))


# ---- the slice cache: when it lists -------------------------------------------------------------

def test_a_device_unknown_to_the_cache_costs_one_list_per_add_and_key(kube_api, get_json):
    vfs(kube_api, "vf-0")
    cache = SliceCache()
    kube_api.add_resource_claim(NS, "first", [("r", SRIOV, "pool-0", "vf-0")])
    assert len(devices_of(claim_pod(kube_api, "one", "first"), get_json, cache)) == 1
    assert lists(kube_api) == 1
    # two devices the cache does not know, in one ADD: one list, not one per device
    kube_api.add_resource_claim(NS, "second", [("r", SRIOV, "pool-0", "vf-8"),
                                               ("r", SRIOV, "pool-0", "vf-9")])
    assert devices_of(claim_pod(kube_api, "two", "second"), get_json, cache) == []
    assert lists(kube_api) == 2 and cache.lists == 2


def test_an_entry_listed_during_this_add_is_not_listed_again_for_a_miss(kube_api, get_json):
    vfs(kube_api, "vf-0")
    cache = SliceCache()
    kube_api.add_resource_claim(NS, "c", [("r", SRIOV, "pool-0", "vf-0"),
                                          ("r", SRIOV, "pool-0", "vf-7")])
    assert [d.device for d in devices_of(claim_pod(kube_api, "web", "c"), get_json, cache)] \
        == ["vf-0"]
    assert lists(kube_api) == 1  # the first use listed it: vf-7 is simply not published


def test_an_entry_older_than_max_age_is_listed_again_even_for_a_hit(kube_api, get_json):
    vfs(kube_api, "vf-0")
    now = [100.0]
    cache = SliceCache(max_age=60.0, clock=lambda: now[0])
    kube_api.add_resource_claim(NS, "c", [("r", SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "web", "c")
    devices_of(pod, get_json, cache)
    now[0] = 159.0
    devices_of(pod, get_json, cache)
    assert lists(kube_api) == 1
    vfs(kube_api, "vf-0")  # republished with the same ID: nothing to see but the age
    now[0] = 161.0
    devices_of(pod, get_json, cache)
    assert lists(kube_api) == 2


def test_a_failed_list_leaves_nothing_cached(kube_api, get_json):
    vfs(kube_api, "vf-0")
    cache = SliceCache()
    kube_api.add_resource_claim(NS, "c", [("r", SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "web", "c")
    kube_api.fail_next("GET", SLICES, 403)
    with pytest.raises(MultusError) as caught:
        devices_of(pod, get_json, cache)
    assert RBAC_HINT in caught.value.msg and "list the ResourceSlices of driver " \
        f"'{SRIOV}' on node 'node-a'" in caught.value.msg
    assert [d.device for d in devices_of(pod, get_json, cache)] == ["vf-0"]


def test_an_add_waiting_for_anothers_list_ends_by_its_deadline(kube_api, get_json):
    vfs(kube_api, "vf-0")
    cache = SliceCache()
    patient = GetJson(get_json.config, timeout=60.0)

    def lookup(deadline: float) -> Optional[SliceDevice]:  # one ADD's lookup of vf-0
        return cache.lookup(patient, patient.config, "node-a", SRIOV, "pool-0", "vf-0",
                            since=cache.clock(), deadline=deadline)

    found: list = []
    kube_api.blackhole()
    listing = threading.Thread(target=lambda: found.append(lookup(soon(60))), daemon=True)
    try:
        listing.start()
        wait_for(lambda: lists(kube_api) == 1, what="the first ADD's list")
        with pytest.raises(DeadlineExceeded) as caught:
            lookup(soon(0.3))
        assert "while waiting for the ResourceSlices of driver" in caught.value.msg
    finally:
        kube_api.blackhole(False)
        listing.join(60)
    assert found == [SliceDevice(device_id="0000:03:00.0", resource_name=RESOURCE)]
    assert lists(kube_api) == 1


def test_unused_stale_entries_are_dropped_and_used_ones_kept(kube_api, get_json):
    now = [0.0]
    cache = SliceCache(max_age=60.0, clock=lambda: now[0])
    for node in ("node-a", "node-b"):
        cache.lookup(get_json, get_json.config, node, SRIOV, "pool-0", "vf-0", since=now[0],
                     deadline=soon())
    assert cache.size() == 2
    now[0] = 61.0
    cache.lookup(get_json, get_json.config, "node-a", SRIOV, "pool-0", "vf-0", since=now[0],
                 deadline=soon())
    assert cache.size() == 1


# ---- one pod's claims ------------------------------------------------------

def test_a_claim_named_by_the_pod_and_its_extended_status_is_read_once_counted_once(
        kube_api, get_json):
    vfs(kube_api, "vf-0")
    kube_api.add_resource_claim(NS, "shared", [("req", SRIOV, "pool-0", "vf-0")])
    extended = {"resourceClaimName": "shared", "requestMappings": [
        {"containerName": "app", "resourceName": RESOURCE, "requestName": "req"}]}
    pod = claim_pod(kube_api, "web", "shared", extended=extended)
    devices = devices_of(pod, get_json)
    assert [(d.claim, d.device) for d in devices] == [("shared", "vf-0")]
    assert len(kube_api.dra_requests("resourceclaims")) == 1


def test_an_extended_mapping_takes_the_subrequests_of_its_request(kube_api, get_json):
    vfs(kube_api, "vf-0", "vf-1", "vf-2")
    kube_api.add_resource_claim(NS, "ext", [("req/fast", SRIOV, "pool-0", "vf-0"),
                                            ("req", SRIOV, "pool-0", "vf-1"),
                                            ("request-2", SRIOV, "pool-0", "vf-2")])
    extended = {"resourceClaimName": "ext", "requestMappings": [
        {"containerName": "app", "resourceName": RESOURCE, "requestName": "req"}]}
    devices = devices_of(claim_pod(kube_api, "web", extended=extended), get_json)
    assert [(d.request, d.device, d.resource_name) for d in devices] == [
        ("req/fast", "vf-0", RESOURCE), ("req", "vf-1", RESOURCE)]  # not request-2


def test_malformed_allocation_results_are_skipped_with_a_warning(kube_api, get_json, caplog):
    vfs(kube_api, "vf-0")
    kube_api.add_resource_claim(NS, "c", [
        {"request": "r", "driver": SRIOV, "pool": "pool-0", "device": "vf-0"},
        {"request": "r", "driver": SRIOV, "pool": "", "device": "vf-1"},
        {"request": "r", "driver": SRIOV, "device": "vf-2"}])
    with caplog.at_level(logging.WARNING, logger="multusd.kube.draclaims"):
        devices = devices_of(claim_pod(kube_api, "web", "c"), get_json)
    assert [d.device for d in devices] == ["vf-0"]
    assert caplog.text.count("skipping a malformed allocation result") == 2


@pytest.mark.parametrize("results", [[], None], ids=["empty", "unallocated"])
def test_a_claim_without_results_is_an_error_with_the_command_to_look(kube_api, get_json,
                                                                      results):
    kube_api.add_resource_claim(NS, "c", results)
    with pytest.raises(MultusError) as caught:
        devices_of(claim_pod(kube_api, "web", "c"), get_json)
    assert "ResourceClaim default/c (the pod's claim 'c0' of pod default/web) has no device " \
        "allocation" in caught.value.msg
    assert "kubectl describe resourceclaim -n default c" in caught.value.msg


def test_what_is_logged_for_a_device_that_is_not_for_a_network(kube_api, get_json, caplog):
    kube_api.add_resource_slice("s", node="node-a", driver=SRIOV, pool="p", devices=[
        gpu_device("gpu-0"), network_device("half", "0000:01:00.1", None),
        network_device("admin", "0000:01:00.2", RESOURCE)])
    kube_api.add_resource_claim(NS, "c", [("r", SRIOV, "p", "gpu-0"), ("r", SRIOV, "p", "half"),
                                          ("r", SRIOV, "p", "unpublished")])
    kube_api.add_resource_claim(NS, "m", [("r", SRIOV, "p", "admin")], adminAccess=True)
    with caplog.at_level(logging.INFO, logger="multusd.kube.draclaims"):
        assert devices_of(claim_pod(kube_api, "web", "c", "m"), get_json) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # a GPU is no one's mistake: not warned about
    assert "device p/half of driver sriov.example.com has no k8s.cni.cncf.io/resourceName " \
        "attribute" in warnings[0]
    assert "device p/unpublished of driver sriov.example.com is in no ResourceSlice of node " \
        "node-a" in warnings[1]
    assert "allocated with adminAccess" in caplog.text


def test_claim_failures_name_the_claim_and_what_to_grant(kube_api, get_json):
    kube_api.add_resource_claim(NS, "c", [("r", SRIOV, "pool-0", "vf-0")])
    pod = claim_pod(kube_api, "web", "c", "gone")
    kube_api.fail_next("GET", CLAIMS + "c", 403)
    with pytest.raises(MultusError) as caught:
        devices_of(pod, get_json)
    assert "get ResourceClaim default/c" in caught.value.msg and RBAC_HINT in caught.value.msg
    kube_api.fail_next("GET", CLAIMS + "c", 503, times=None)
    with pytest.raises(TryAgainLater):
        devices_of(pod, get_json, deadline=soon(0.5))
    kube_api.clear_failures()
    vfs(kube_api, "vf-0")
    with pytest.raises(MultusError) as caught:
        devices_of(pod, get_json)  # claim c is found, "gone" is not
    assert "ResourceClaim default/gone (the pod's claim 'c1' of pod default/web) was not " \
        "found (404)" in caught.value.msg


def test_failure_adds_the_grants_to_a_403_only(kube_api, get_json):
    config = get_json.config
    for status, hinted in ((403, True), (404, False), (401, False)):
        kube_api.fail_next("GET", SLICES, status)
        with pytest.raises(config.request_errors()) as caught:
            get_json(SLICES)
        error = draclaims.failure(config, caught.value, "list slices")
        assert (RBAC_HINT in error.msg) is hinted
        assert error.msg.startswith(config.failure(caught.value, "list slices").msg)


# ---- slice_devices: what a list is read into ---------------------------------------------------

def test_slice_devices_reads_only_string_attributes_of_named_devices():
    items = [{"spec": {"nodeName": "node-a", "driver": SRIOV, "devices": [
        {"name": "vf-0", "attributes": {
            "k8s.cni.cncf.io/deviceID": {"int": 3},
            "k8s.cni.cncf.io/resourceName": {"string": RESOURCE}}},
        {"name": "vf-1", "attributes": "junk"},
        {"attributes": {}}, {"name": 7}, "junk"]}}]
    # no pool: the pool named "" at generation 0
    assert slice_devices(items, "node-a", SRIOV) == {
        ("", "vf-0"): SliceDevice(device_id="", resource_name=RESOURCE),
        ("", "vf-1"): SliceDevice(device_id="", resource_name="")}


def test_slice_devices_keeps_each_pools_newest_generation():
    def item(pool: str, generation: Any, device: str) -> dict:
        return {"spec": {"nodeName": "node-a", "driver": SRIOV,
                         "pool": {"name": pool, "generation": generation},
                         "devices": [network_device(device, device, RESOURCE)]}}

    items = [item("p", 2, "new"), item("p", 1, "old"), item("q", 1, "other-pool"),
             item("p", 2, "new-too"), item("r", "3", "generation-not-a-number")]
    assert sorted(slice_devices(items, "node-a", SRIOV)) == [
        ("p", "new"), ("p", "new-too"), ("q", "other-pool"), ("r", "generation-not-a-number")]

