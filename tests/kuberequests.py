"""What the stand-in API server reads off a request, and how it refuses one, as kube-apiserver does.

Shared by tests/kubeapi.py and its parts (kubehandler, kubewatch, kubefaults, kubecache,
kubedra):

* :func:`status_object`, :class:`ApiError` (raised inside a handler, answered as that
  metav1.Status), :func:`not_found`;
* :class:`FieldSelector`: the ``fieldSelector`` terms kube-apiserver supports on pods;
* :func:`forbidden`: RBAC's refusal;
* :func:`is_watch`; :func:`request_attributes`: the verb, group, resource and namespace that
  RBAC judges, as kube-apiserver's RequestInfo resolves them.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

NAD_GROUP_PATH = "/apis/k8s.cni.cncf.io/v1"
RBAC_USER = "multusd"  # who the default token is

Obj = Dict[str, Any]
Key = Tuple[str, str]


def timestamp() -> str:
    """Now, as metadata timestamps are written."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_object(code: int, reason: str, message: str) -> Obj:
    """A metav1.Status failure body, as kube-apiserver sends with every error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ApiError(Exception):
    """Raised inside a handler: becomes a Status response with this code."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Optional[Obj] = None, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status_object(code, reason, message)
        self.headers = headers or {}
        if details is not None:
            self.status["details"] = details


def not_found(resource: str, name: str) -> ApiError:
    """kube-apiserver's NotFound of one object: ``details`` name it (a missing resource type
    has no ``details.name``)."""
    plural, _, group = resource.partition(".")
    return ApiError(404, "NotFound", f'{resource} "{name}" not found',
                    {"name": name, "group": group, "kind": plural})


class FieldSelector:
    """``fieldSelector`` terms of the form ``field=value``/``field==value``/``field!=value``."""

    FIELDS: Dict[str, Callable[[Obj], str]] = {
        "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName", ""),
        "metadata.name": lambda o: o["metadata"]["name"],
        "metadata.namespace": lambda o: o["metadata"]["namespace"],
    }

    def __init__(self, text: str) -> None:
        self.terms: List[Tuple[Callable[[Obj], str], str, bool]] = []
        for term in filter(None, (t.strip() for t in text.split(","))):
            match = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)
            if not match or match.group(1) not in self.FIELDS:
                raise ApiError(400, "BadRequest", f'"{term}" is not a known field selector: '
                               f"only {sorted(self.FIELDS)} are supported")
            field, op, value = match.groups()
            self.terms.append((self.FIELDS[field], value, op != "!="))

    def matches(self, obj: Optional[Obj]) -> bool:
        if obj is None:
            return False
        return all((get(obj) == value) == equal for get, value, equal in self.terms)


def forbidden(user: str, attributes: Tuple[str, str, str, str], why: str = "") -> ApiError:
    """RBAC's 403 of a request (its :func:`request_attributes`), kube-apiserver's message;
    ``why``: what the authorizer adds (": RBAC: ...")."""
    verb, group, resource, namespace = attributes
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    return ApiError(403, "Forbidden", f'{resource.split("/")[0]} is forbidden: User "{user}" '
                    f'cannot {verb} resource "{resource}" in API group "{group}"{where}{why}')


def is_watch(query: Dict[str, str]) -> bool:
    """A watch (``watch=true``), not a LIST."""
    return query.get("watch", "").lower() in ("true", "1")


def request_attributes(method: str, path: str,
                       query: Dict[str, str]) -> Optional[Tuple[str, str, str, str]]:
    """(verb, group, resource[/subresource], namespace) of a resource request, as kube-apiserver's
    RequestInfo resolves it; None for non-resource paths (/version)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    named = len(rest) >= 2
    verb = {"GET": "get" if named else ("watch" if is_watch(query) else "list"),
            "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return verb, group, resource, namespace
