"""The six API requests the daemon sends, each a path and a method through ``ApiClient.call_api``.

The generated ``CoreV1Api`` is a 1.6 MB module (~6 ms of a cold start, ~2.5 MB resident with
``CustomObjectsApi``) whose methods only check their keyword names and fill in a path, a
query and an ``Accept`` header before calling ``ApiClient.call_api``. :class:`ApiCalls` has
the same method names and signatures for the requests multusd sends and makes the same
``call_api`` calls (path parameters quoted by it, bearer-token auth, JSON), so the client's
REST layer, retries, TLS and error types are the package's own.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

_OPTIONS = ("_preload_content", "_request_timeout", "_return_http_data_only")
_QUERY_NAMES = {"_continue": "continue"}
_ACCEPT = {"Accept": "application/json"}  # what select_header_accept picks for every one


class ApiCalls:
    """``CoreV1Api``'s and ``CustomObjectsApi``'s methods that multusd uses, same signatures."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        return self._call("GET", "/api/v1/pods", {}, kwargs)

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self._call("GET", "/api/v1/namespaces/{namespace}/pods/{name}",
                          {"namespace": namespace, "name": name}, kwargs)

    def replace_namespaced_pod_status(self, name: str, namespace: str, body: Any,
                                      **kwargs: Any) -> Any:
        return self._call("PUT", "/api/v1/namespaces/{namespace}/pods/{name}/status",
                          {"namespace": namespace, "name": name}, kwargs, body)

    def create_namespaced_event(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        return self._call("POST", "/api/v1/namespaces/{namespace}/events",
                          {"namespace": namespace}, kwargs, body)

    def list_cluster_custom_object(self, group: str, version: str, plural: str,
                                   **kwargs: Any) -> Any:
        return self._call("GET", "/apis/{group}/{version}/{plural}",
                          {"group": group, "version": version, "plural": plural}, kwargs)

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                     plural: str, name: str, **kwargs: Any) -> Any:
        return self._call("GET", "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
                          {"group": group, "version": version, "namespace": namespace,
                           "plural": plural, "name": name}, kwargs)

    def get(self, path: str, query_params: Dict[str, str], **kwargs: Any) -> Any:
        """GET of ``path`` as given (already quoted), the query named as the API names it."""
        return self._call("GET", path, {}, {**query_params, **kwargs})

    def _call(self, method: str, path: str, path_params: Dict[str, str],
              kwargs: Dict[str, Any], body: Any = None) -> Any:
        options = {key: kwargs.pop(key) for key in _OPTIONS if key in kwargs}
        return self.api_client.call_api(
            path, method, path_params, query(kwargs), dict(_ACCEPT), body=body,
            post_params=[], files={}, response_type=None, auth_settings=["BearerToken"],
            _return_http_data_only=options.get("_return_http_data_only", True),
            _preload_content=options.get("_preload_content", True),
            _request_timeout=options.get("_request_timeout"), collection_formats={})


def query(kwargs: Dict[str, Any]) -> List[Tuple[str, Any]]:
    """The query of keyword arguments, named as the generated methods name them
    (``field_selector`` -> ``fieldSelector``, ``_continue`` -> ``continue``); None is left out."""
    out = []
    for key, value in kwargs.items():
        if value is None:
            continue
        name = _QUERY_NAMES.get(key)
        if name is None:
            head, *rest = key.split("_")
            name = head + "".join(part.capitalize() for part in rest)
        out.append((name, value))
    return out
