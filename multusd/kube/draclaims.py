"""DRA devices of a pod: its ResourceClaims' allocations, looked up in this node's ResourceSlices.

Dynamic Resource Allocation (``resource.k8s.io/v1``) gives a network device to a pod through a
ResourceClaim; the driver publishes the device in a ResourceSlice, and a device meant for a
CNI plugin carries two string attributes: ``k8s.cni.cncf.io/resourceName`` (what a NAD's
``k8s.v1.cni.cncf.io/resourceName`` annotation names) and ``k8s.cni.cncf.io/deviceID`` (what
the plugin gets as ``deviceID``). Upstream Multus reads the same (``pkg/draclient``); here:

* nothing is asked for a pod without claims (:attr:`Pod.resource_claims` is empty and it has
  no ``extendedResourceClaimStatus``);
* each ResourceClaim is read once per ADD (allocations are per pod and change with it);
* ResourceSlices are listed per (node, driver) with the field selectors ``spec.nodeName`` and
  ``spec.driver`` on first use, and kept as two attributes per (pool, device) in a
  :class:`SliceCache` shared by every ADD; a device it does not know costs one new list (at
  most one per ADD and key, and concurrent ADDs share it), and so does an entry older than
  :data:`SLICE_MAX_AGE`; such an entry is dropped when no ADD uses it (it would be listed
  again anyway), so that pods of other nodes and drivers no longer in use do not pile up
  over the daemon's uptime. Slices of another node or driver are dropped even if a server sent
  them, and of a pool only the slices of its newest generation count (older ones are being
  replaced by the driver);
* a device lacking either attribute is skipped (a GPU in the same claim is no error), as is
  one that is in none of this node's slices and one allocated with ``adminAccess`` (access
  to a device another pod holds, never to be moved into this pod); a claim without an
  allocation is an error naming it;
* ``status.extendedResourceClaimStatus`` (extended resources backed by DRA): each
  ``requestMappings`` entry's ``resourceName`` is the key of its request's devices, and a
  device that is missing, lacks the attributes or names another resource is an error.

The API server is reached only through one callable, ``get_json(path, query,
deadline=...)``, which returns the decoded JSON answer and raises what
``ClientConfig.request_errors()`` lists (``.status`` is the HTTP status); failures are
translated by ``ClientConfig.failure``. Every request is bounded by the ADD's deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote

from multusd.errors import DeadlineExceeded, MultusError
from multusd.kube.objects import Obj, Pod
from multusd.store.valueclass import Record

LOG = logging.getLogger(__name__)

API_PATH = "/apis/resource.k8s.io/v1"
DEVICE_ID_ATTRIBUTE = "k8s.cni.cncf.io/deviceID"
RESOURCE_NAME_ATTRIBUTE = "k8s.cni.cncf.io/resourceName"
SLICE_MAX_AGE = 60.0  # seconds a (node, driver) list is trusted without a miss
RBAC_HINT = ("pods with DRA claims also need resource.k8s.io resourceclaims: get and "
             "resourceslices: list (the multusd ClusterRole of /usr/share/multusd/rbac.yaml)")

GetJson = Callable[..., Obj]  # get_json(path, query, deadline=...) -> decoded JSON
PoolDevice = Tuple[str, str]  # (pool, device)


class SliceDevice(Record):
    """What multusd keeps of one published device: its two attributes ("" when absent)."""

    device_id: str
    resource_name: str


class AllocatedDevice(Record):
    """One device allocated to a pod that a NAD with a resourceName can use."""

    claim: str          # the ResourceClaim's name (in the pod's namespace)
    request: str        # the claim's request it was allocated for
    driver: str
    pool: str
    device: str
    device_id: str      # its k8s.cni.cncf.io/deviceID
    resource_name: str  # its k8s.cni.cncf.io/resourceName (the extended mapping's, there)


class _Entry:
    """The devices of one (node, driver), and the lock of whoever lists them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.devices: Optional[Dict[PoolDevice, SliceDevice]] = None
        self.loaded_at = float("-inf")
        self.users = 0  # lookups holding or waiting for it (guarded by SliceCache._lock)


class SliceCache:
    """ResourceSlice devices per (node, driver), shared by every ADD (see the module docstring).

    :param max_age: seconds after which an entry is listed again at its next use.
    """

    def __init__(self, max_age: float = SLICE_MAX_AGE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: Dict[Tuple[str, str], _Entry] = {}
        self.lists = 0  # ResourceSlice lists sent (for tests and metrics)

    def lookup(self, get_json: GetJson, config: Any, node: str, driver: str, pool: str,
               device: str, *, since: float, deadline: Optional[float]) -> Optional[SliceDevice]:
        """The attributes of ``pool``/``device`` of ``driver`` on ``node``; None if unpublished.

        :param since: when the caller's ADD began: a miss lists again only when the entry
            was listed before that (not by this ADD, nor by one that ran meanwhile).
        :raises MultusError: the list failed (translated), or the deadline passed.
        """
        with self._lock:
            self._drop_unused(self.clock())
            entry = self._entries.setdefault((node, driver), _Entry())
            entry.users += 1
        try:
            return self._lookup(entry, get_json, config, node, driver, pool, device, since,
                                deadline)
        finally:
            with self._lock:
                entry.users -= 1

    def _drop_unused(self, now: float) -> None:
        """Forget the entries no lookup uses that would be listed again anyway (lock held)."""
        for key, entry in list(self._entries.items()):
            if entry.users == 0 and now - entry.loaded_at > self.max_age:
                del self._entries[key]

    def _lookup(self, entry: _Entry, get_json: GetJson, config: Any, node: str, driver: str,
                pool: str, device: str, since: float,
                deadline: Optional[float]) -> Optional[SliceDevice]:
        timeout = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not entry.lock.acquire(timeout=timeout):
            raise DeadlineExceeded(f"the request's deadline passed while waiting for the "
                                   f"ResourceSlices of driver {driver!r} on node {node!r}")
        try:
            now = self.clock()
            if entry.devices is None or now - entry.loaded_at > self.max_age:
                self._load(entry, get_json, config, node, driver, deadline)
            found = entry.devices.get((pool, device)) if entry.devices is not None else None
            if found is None and entry.loaded_at < since:
                LOG.debug("device %s/%s of driver %s is not in the cached ResourceSlices of "
                          "node %s: listing them again", pool, device, driver, node)
                self._load(entry, get_json, config, node, driver, deadline)
                found = entry.devices.get((pool, device)) if entry.devices is not None else None
            return found
        finally:
            entry.lock.release()

    def _load(self, entry: _Entry, get_json: GetJson, config: Any, node: str, driver: str,
              deadline: Optional[float]) -> None:
        query = {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}
        with self._lock:
            self.lists += 1
        try:
            answer = get_json(f"{API_PATH}/resourceslices", query, deadline=deadline)
        except config.request_errors() as exc:
            raise failure(config, exc, f"list the ResourceSlices of driver {driver!r} on node "
                                       f"{node!r}") from exc
        items = answer.get("items") if isinstance(answer, dict) else None
        entry.devices = slice_devices(items if isinstance(items, list) else [], node, driver)
        entry.loaded_at = self.clock()
        LOG.debug("ResourceSlices of driver %s on node %s: %d device(s)", driver, node,
                  len(entry.devices))

    def size(self) -> int:
        """How many (node, driver) entries are held."""
        with self._lock:
            return len(self._entries)


def slice_devices(items: List[Any], node: str, driver: str) -> Dict[PoolDevice, SliceDevice]:
    """(pool, device) -> attributes, from ResourceSlice dicts of ``driver`` on ``node``.

    Slices of another node or driver are ignored, and so are those of a pool's older
    generations (a driver replacing its slices publishes the new generation first).
    """
    slices = []
    newest: Dict[str, int] = {}
    for item in items:
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(spec, dict) or spec.get("nodeName") != node \
                or spec.get("driver") != driver:
            continue
        pool = spec.get("pool") if isinstance(spec.get("pool"), dict) else {}
        name, generation = str(pool.get("name") or ""), pool.get("generation")
        generation = generation if isinstance(generation, int) else 0
        newest[name] = max(newest.get(name, generation), generation)
        slices.append((name, generation, spec.get("devices")))
    devices: Dict[PoolDevice, SliceDevice] = {}
    for pool, generation, published in slices:
        if generation < newest[pool] or not isinstance(published, list):
            continue
        for device in published:
            if isinstance(device, dict) and isinstance(device.get("name"), str):
                attributes = device.get("attributes")
                attributes = attributes if isinstance(attributes, dict) else {}
                devices[(pool, device["name"])] = SliceDevice(
                    device_id=_string_attribute(attributes, DEVICE_ID_ATTRIBUTE),
                    resource_name=_string_attribute(attributes, RESOURCE_NAME_ATTRIBUTE))
    return devices


def _string_attribute(attributes: Dict[str, Any], name: str) -> str:
    value = attributes.get(name)
    text = value.get("string") if isinstance(value, dict) else None
    return text if isinstance(text, str) else ""


def failure(config: Any, exc: BaseException, action: str) -> MultusError:
    """``config.failure``, with the DRA grants named when the API server said 403."""
    error = config.failure(exc, action)
    if getattr(exc, "status", None) == 403:
        return MultusError(f"{error.msg}; {RBAC_HINT}", error.details)
    return error


# --- one pod -------------------------------------------------------------------------------


def pod_devices(pod: Pod, get_json: GetJson, config: Any, cache: SliceCache, *, node: str,
                deadline: Optional[float] = None) -> List[AllocatedDevice]:
    """The devices DRA allocated to ``pod`` that carry both attributes (see the module docstring).

    :param node: whose ResourceSlices to search (the pod's spec.nodeName: this node).
    :raises MultusError: a claim is missing or not allocated, an extended-resource device does
        not match its mapping, or a request failed (401, 403, unreachable: translated).
    """
    if not pod.resource_claims and pod.extended_claim is None:
        return []
    lookup = _PodLookup(pod, get_json, config, cache, node, deadline)
    found: List[AllocatedDevice] = []
    for local, claim in pod.resource_claims:
        found.extend(lookup.claim_devices(claim, local))
    if pod.extended_claim is not None:
        found.extend(lookup.extended_devices(pod.extended_claim))
    unique, seen = [], set()
    for device in found:  # one device of a claim counts once, whichever path named it
        key = (device.claim, device.driver, device.pool, device.device)
        if key not in seen:
            seen.add(key)
            unique.append(device)
    return unique


class _PodLookup:
    """The claims and devices of one pod's ADD (each claim read once)."""

    def __init__(self, pod: Pod, get_json: GetJson, config: Any, cache: SliceCache,
                 node: str, deadline: Optional[float]) -> None:
        self.pod, self.get_json, self.config, self.cache = pod, get_json, config, cache
        self.node, self.deadline = node, deadline
        self.since = cache.clock()
        self.claims: Dict[str, Obj] = {}

    def claim_devices(self, claim: str, local: str) -> List[AllocatedDevice]:
        where = self._claim_label(claim, f"the pod's claim {local!r}" if local else "")
        results = self._results(claim, where)
        devices: List[AllocatedDevice] = []
        for result in results:
            driver, pool, device, request = result
            attributes = self._attributes(result, where)
            if attributes is None:
                continue
            if not attributes.device_id or not attributes.resource_name:
                missing = [a for a, v in ((DEVICE_ID_ATTRIBUTE, attributes.device_id),
                                          (RESOURCE_NAME_ATTRIBUTE, attributes.resource_name))
                           if not v]
                # a GPU lacks both: not for a CNI plugin; lacking one is a driver's mistake
                LOG.log(logging.DEBUG if len(missing) == 2 else logging.WARNING,
                        "%s: device %s/%s of driver %s has no %s attribute: not a device for "
                        "a network, skipped", where, pool, device, driver, " or ".join(missing))
                continue
            devices.append(AllocatedDevice(claim=claim, request=request, driver=driver,
                                           pool=pool, device=device,
                                           device_id=attributes.device_id,
                                           resource_name=attributes.resource_name))
        if results and not devices:
            LOG.debug("%s: none of its %d device(s) is published for a network", where,
                      len(results))
        return devices

    def extended_devices(self, extended: Any) -> List[AllocatedDevice]:
        claim = extended.claim
        where = self._claim_label(claim, "the pod's extended-resource claim")
        results = self._results(claim, where)
        devices: List[AllocatedDevice] = []
        for _container, resource, request_name in extended.mappings:
            matching = [r for r in results
                        if r[3] == request_name or r[3].startswith(request_name + "/")]
            if not matching:
                raise MultusError(
                    f"{where}: request {request_name!r}, which the pod's "
                    f"extendedResourceClaimStatus maps to resource {resource!r}, has no "
                    "allocated device in the claim; check `kubectl get resourceclaim -n "
                    f"{self.pod.namespace} {claim} -o yaml`")
            for result in matching:
                driver, pool, device, request = result
                label = f"device {pool}/{device} of driver {driver!r} (request {request!r})"
                attributes = self._attributes(result, where, required=True)
                if attributes is None:
                    raise MultusError(
                        f"{where}: {label}, allocated for extended resource {resource!r}, is "
                        f"in no ResourceSlice of node {self.node!r}; the driver must publish "
                        "it there")
                if not attributes.resource_name or not attributes.device_id:
                    missing = RESOURCE_NAME_ATTRIBUTE if not attributes.resource_name \
                        else DEVICE_ID_ATTRIBUTE
                    raise MultusError(
                        f"{where}: {label} has no {missing} attribute in its ResourceSlice; a "
                        f"device allocated for extended resource {resource!r} must carry "
                        f"{RESOURCE_NAME_ATTRIBUTE}={resource!r} and a {DEVICE_ID_ATTRIBUTE}")
                if attributes.resource_name != resource:
                    raise MultusError(
                        f"{where}: {label} has {RESOURCE_NAME_ATTRIBUTE} "
                        f"{attributes.resource_name!r}, but the pod's extended-resource "
                        f"mapping for request {request_name!r} is {resource!r}; the driver's "
                        "attribute and the extended resource name (the NAD's "
                        "k8s.v1.cni.cncf.io/resourceName) must be the same")
                devices.append(AllocatedDevice(claim=claim, request=request, driver=driver,
                                               pool=pool, device=device,
                                               device_id=attributes.device_id,
                                               resource_name=resource))
        return devices

    # -- helpers ------------------------------------------------------------------------------

    def _claim_label(self, claim: str, role: str) -> str:
        pod = f"{self.pod.namespace}/{self.pod.name}"
        return (f"ResourceClaim {self.pod.namespace}/{claim} ({role} of pod {pod})" if role
                else f"ResourceClaim {self.pod.namespace}/{claim} of pod {pod}")

    def _results(self, claim: str, where: str) -> List[Tuple[str, str, str, str]]:
        """(driver, pool, device, request) of each allocated device; raises if unallocated."""
        obj = self._claim(claim, where)
        status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        allocation = status.get("allocation") if isinstance(status.get("allocation"), dict) \
            else {}
        devices = allocation.get("devices") if isinstance(allocation.get("devices"), dict) \
            else {}
        results = devices.get("results")
        if not isinstance(results, list) or not results:
            raise MultusError(
                f"{where} has no device allocation (status.allocation.devices.results is "
                "empty): the devices of the pod's networks with a resourceName cannot be "
                f"found; see `kubectl describe resourceclaim -n {self.pod.namespace} {claim}`")
        found = []
        for result in results:
            if not isinstance(result, dict):
                continue
            fields = tuple(result.get(k) for k in ("driver", "pool", "device", "request"))
            if not all(isinstance(f, str) and f for f in fields[:3]):
                LOG.warning("%s: skipping a malformed allocation result %r", where, result)
                continue
            if result.get("adminAccess") is True:
                LOG.info("%s: device %s/%s of driver %s is allocated with adminAccess (access "
                         "to a device others may hold): not given to a network", where,
                         fields[1], fields[2], fields[0])
                continue
            found.append(tuple(str(f or "") for f in fields))
        return found  # type: ignore[return-value]

    def _claim(self, claim: str, where: str) -> Obj:
        if claim in self.claims:
            return self.claims[claim]
        namespace = self.pod.namespace
        path = (f"{API_PATH}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
                f"{quote(claim, safe='')}")
        try:
            obj = self.get_json(path, None, deadline=self.deadline)
        except self.config.request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                raise MultusError(
                    f"{where} was not found (404): it was deleted, or the API server does "
                    "not serve resource.k8s.io/v1 (Kubernetes 1.34 and later do); the pod's "
                    "devices cannot be found without it") from exc
            raise failure(self.config, exc, f"get {where}") from exc
        self.claims[claim] = obj if isinstance(obj, dict) else {}
        return self.claims[claim]

    def _attributes(self, result: Tuple[str, str, str, str], where: str, *,
                    required: bool = False) -> Optional[SliceDevice]:
        driver, pool, device, _request = result
        found = self.cache.lookup(self.get_json, self.config, self.node, driver, pool, device,
                                  since=self.since, deadline=self.deadline)
        if found is None and not required:
            LOG.warning("%s: device %s/%s of driver %s is in no ResourceSlice of node %s: "
                        "skipped", where, pool, device, driver, self.node)
        return found
