"""The stand-in API server's resource.k8s.io/v1 part: ResourceClaims and ResourceSlices (DRA).

Mixed into tests/kubeapi.py's :class:`FakeKubeAPI` (:class:`DraStore`, the test controls)
and its request handler (:class:`DraRoutes`). As kube-apiserver serves them:

* ResourceClaims are namespaced: ``GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/
  <name>`` (404 ``resourceclaims.resource.k8s.io "<name>" not found``), and their list;
* ResourceSlices are cluster-scoped: ``GET /apis/resource.k8s.io/v1/resourceslices`` with the
  field selectors kube-apiserver supports for them (``metadata.name``, ``spec.nodeName``,
  ``spec.driver``; any other field is 400 BadRequest ``field label not supported``), and
  GET of one;
* ``GET /apis/resource.k8s.io/v1`` is the group version's discovery document;
* with :attr:`DraStore.serve_dra` False the server is one without DRA (Kubernetes before
  1.34, or the API disabled): every resource.k8s.io path is 404.

RBAC and injected failures apply as to every request (tests/kubeapi.py ``deny``,
``fail_next``); every request is in ``requests``.
"""

from __future__ import annotations

import copy
import re
import sys
import uuid
from typing import Any, Dict, Iterable, List, Optional, Tuple

DRA_PATH = "/apis/resource.k8s.io/v1"
DRA_VERSION = "resource.k8s.io/v1"
DEVICE_ID = "k8s.cni.cncf.io/deviceID"
RESOURCE_NAME = "k8s.cni.cncf.io/resourceName"
SLICE_FIELDS = {
    "metadata.name": lambda o: o["metadata"]["name"],
    "spec.nodeName": lambda o: o["spec"].get("nodeName", ""),
    "spec.driver": lambda o: o["spec"].get("driver", ""),
}

Obj = Dict[str, Any]


def network_device(name: str, device_id: Optional[str], resource_name: Optional[str],
                   **other: str) -> Obj:
    """A ResourceSlice device with the two attributes Multus reads (None leaves one out) and
    ``other`` string attributes (a driver publishes more: pciAddress, pfName...)."""
    attributes: Obj = {key: {"string": value} for key, value in other.items()}
    if device_id is not None:
        attributes[DEVICE_ID] = {"string": device_id}
    if resource_name is not None:
        attributes[RESOURCE_NAME] = {"string": resource_name}
    return {"name": name, "attributes": attributes}


def gpu_device(name: str) -> Obj:
    """A device of no interest to a CNI plugin (no Multus attributes)."""
    return {"name": name, "attributes": {"gpu.example.com/model": {"string": "LATEST-GPU"},
                                         "gpu.example.com/index": {"int": 0}},
            "capacity": {"memory": {"value": "80Gi"}}}


class DraStore:
    """Test controls of the resource.k8s.io objects (FakeKubeAPI mixes this in)."""

    serve_dra = True

    def _init_dra(self) -> None:
        self._claims: Dict[Tuple[str, str], Obj] = {}
        self._slices: Dict[str, Obj] = {}

    def add_resource_claim(self, namespace: str, name: str,
                           results: Optional[Iterable[Any]] = None, *,
                           requests: Iterable[str] = ("req-0",), **result_extra: Any) -> Obj:
        """Create or replace a ResourceClaim; ``results`` are its allocation's results, each a
        (request, driver, pool, device) tuple or a result dict (None: not allocated).
        ``result_extra`` goes into every result (``adminAccess=True``...)."""
        claim: Obj = {
            "apiVersion": DRA_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
            "spec": {"devices": {"requests": [
                {"name": r, "exactly": {"deviceClassName": "net.example.com"}}
                for r in requests]}},
            "status": {},
        }
        if results is not None:
            claim["status"] = {"allocation": {"devices": {"results": [
                dict(dict(r) if isinstance(r, dict) else dict(zip(
                    ("request", "driver", "pool", "device"), r)), **result_extra)
                for r in results]}}}
        with self._cond:  # type: ignore[attr-defined]
            claim["metadata"]["resourceVersion"] = self._bump()  # type: ignore[attr-defined]
            self._claims[(namespace, name)] = claim
            return copy.deepcopy(claim)

    def delete_resource_claim(self, namespace: str, name: str) -> None:
        with self._cond:  # type: ignore[attr-defined]
            del self._claims[(namespace, name)]

    def add_resource_slice(self, name: Any, *, node: str = "", driver: str = "",
                           pool: str = "", devices: Optional[List[Obj]] = None,
                           generation: int = 1, slice_count: int = 1) -> Obj:
        """Create or replace a ResourceSlice of ``driver`` on ``node`` (pool ``pool``); or,
        given a whole ResourceSlice dict as ``name``, store that."""
        if isinstance(name, dict):
            given = copy.deepcopy(name)
            with self._cond:  # type: ignore[attr-defined]
                given.setdefault("metadata", {})["resourceVersion"] = \
                    self._bump()  # type: ignore[attr-defined]
                self._slices[given["metadata"]["name"]] = given
                return copy.deepcopy(given)
        obj: Obj = {
            "apiVersion": DRA_VERSION, "kind": "ResourceSlice",
            "metadata": {"name": name, "uid": str(uuid.uuid4())},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool, "generation": generation,
                              "resourceSliceCount": slice_count},
                     "devices": copy.deepcopy(devices or [])},
        }
        with self._cond:  # type: ignore[attr-defined]
            obj["metadata"]["resourceVersion"] = self._bump()  # type: ignore[attr-defined]
            self._slices[name] = obj
            return copy.deepcopy(obj)

    def delete_resource_slice(self, name: str) -> None:
        with self._cond:  # type: ignore[attr-defined]
            del self._slices[name]

    def dra_requests(self, kind: str = "") -> List[Tuple[str, str, Dict[str, str]]]:
        """The requests sent to resource.k8s.io (``kind``: "resourceclaims" or
        "resourceslices" narrows them)."""
        with self._cond:  # type: ignore[attr-defined]
            return [r for r in self.requests  # type: ignore[attr-defined]
                    if r[1].startswith(DRA_PATH) and kind in r[1]]


ROUTES = [
    ("GET", re.compile(DRA_PATH + r"/?"), "dra_discovery"),
    ("GET", re.compile(DRA_PATH + r"/namespaces/(?P<ns>[^/]+)/resourceclaims"), "list_claims"),
    ("GET", re.compile(DRA_PATH + r"/namespaces/(?P<ns>[^/]+)/resourceclaims/(?P<name>[^/]+)"),
     "get_claim"),
    ("GET", re.compile(DRA_PATH + r"/resourceslices"), "list_slices"),
    ("GET", re.compile(DRA_PATH + r"/resourceslices/(?P<name>[^/]+)"), "get_slice"),
]


class DraRoutes:
    """The request handler's resource.k8s.io routes (the handler mixes this in)."""

    def _dra_api(self) -> Any:
        api = self.server.api  # type: ignore[attr-defined]
        if not api.serve_dra:
            raise self._api_error(404, "NotFound", "the server could not find the requested "
                                  "resource")
        return api

    def _api_error(self, code: int, reason: str, message: str) -> Exception:
        """tests/kubeapi.py's ApiError (its module, whatever name it was imported under)."""
        return sys.modules[type(self).__module__].ApiError(code, reason, message)

    def do_route_dra_discovery(self, **_: Any) -> None:
        self._dra_api()
        resources = [
            {"name": "resourceclaims", "singularName": "resourceclaim", "namespaced": True,
             "kind": "ResourceClaim", "verbs": ["create", "delete", "get", "list", "patch",
                                                "update", "watch"]},
            {"name": "resourceclaims/status", "singularName": "", "namespaced": True,
             "kind": "ResourceClaim", "verbs": ["get", "patch", "update"]},
            {"name": "resourceslices", "singularName": "resourceslice", "namespaced": False,
             "kind": "ResourceSlice", "verbs": ["create", "delete", "get", "list", "patch",
                                                "update", "watch"]},
        ]
        self._send_json(200, {"kind": "APIResourceList", "apiVersion": "v1",  # type: ignore
                              "groupVersion": DRA_VERSION, "resources": resources})

    def do_route_get_claim(self, ns: str, name: str, **_: Any) -> None:
        api = self._dra_api()
        with api._cond:
            claim = api._claims.get((ns, name))
            claim = copy.deepcopy(claim) if claim is not None else None
        if claim is None:
            raise self._api_error(404, "NotFound",
                                  f'resourceclaims.resource.k8s.io "{name}" not found')
        self._send_json(200, claim)  # type: ignore[attr-defined]

    def do_route_list_claims(self, ns: str, **_: Any) -> None:
        api = self._dra_api()
        with api._cond:
            items = [copy.deepcopy(c) for key, c in api._claims.items() if key[0] == ns]
            rv = str(api._rv)
        self._send_json(200, {"kind": "ResourceClaimList", "apiVersion": DRA_VERSION,  # type: ignore
                              "metadata": {"resourceVersion": rv}, "items": items})

    def do_route_list_slices(self, query: Dict[str, str], **_: Any) -> None:
        api = self._dra_api()
        terms = self._slice_selector(query.get("fieldSelector", ""))
        with api._cond:
            items = [copy.deepcopy(s) for s in api._slices.values()
                     if all((SLICE_FIELDS[f](s) == v) == eq for f, v, eq in terms)]
            rv = str(api._rv)
        self._send_json(200, {"kind": "ResourceSliceList", "apiVersion": DRA_VERSION,  # type: ignore
                              "metadata": {"resourceVersion": rv}, "items": items})

    def do_route_get_slice(self, name: str, **_: Any) -> None:
        api = self._dra_api()
        with api._cond:
            obj = copy.deepcopy(api._slices.get(name))
        if obj is None:
            raise self._api_error(404, "NotFound",
                                  f'resourceslices.resource.k8s.io "{name}" not found')
        self._send_json(200, obj)  # type: ignore[attr-defined]

    def _slice_selector(self, text: str) -> List[Tuple[str, str, bool]]:
        terms = []
        for term in filter(None, (t.strip() for t in text.split(","))):
            match = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)
            if not match:
                raise self._api_error(400, "BadRequest", f"invalid selector: '{text}'; can't "
                                      f"understand '{term}'")
            field, op, value = match.groups()
            if field not in SLICE_FIELDS:
                raise self._api_error(400, "BadRequest",
                                      f'field label not supported: {field}')
            terms.append((field, value, op != "!="))
        return terms
