"""multusd.kube.calls: the requests the daemon sends are the ones the generated API classes send."""

import pytest
from kubernetes import client

from multusd.kube.calls import ApiCalls, query


class Recording(client.ApiClient):
    """The package's ApiClient, recording what reaches call_api instead of sending it."""

    def __init__(self) -> None:
        super().__init__(client.Configuration())
        self.calls = []

    def call_api(self, resource_path, method, path_params=None, query_params=None,
                 header_params=None, body=None, **kwargs):
        self.calls.append({"path": resource_path, "method": method,
                           "path_params": dict(path_params or {}),
                           "query": sorted(query_params or []),
                           "accept": (header_params or {}).get("Accept"), "body": body,
                           "auth": kwargs.get("auth_settings"),
                           "preload": kwargs.get("_preload_content"),
                           "timeout": kwargs.get("_request_timeout")})
        return "sent"


POD = {"metadata": {"name": "web", "namespace": "team"}}
CASES = [
    ("list_pod_for_all_namespaces", (), {"field_selector": "spec.nodeName=n", "watch": True,
                                         "resource_version": "42", "allow_watch_bookmarks": True,
                                         "timeout_seconds": 300}),
    ("read_namespaced_pod", ("web", "team"), {}),
    ("replace_namespaced_pod_status", ("web", "team", POD), {}),
    ("create_namespaced_event", ("team", {"kind": "Event"}), {}),
    ("list_cluster_custom_object", ("k8s.cni.cncf.io", "v1", "network-attachment-definitions"),
     {"resource_version": "7", "watch": True}),
    ("get_namespaced_custom_object",
     ("k8s.cni.cncf.io", "v1", "team", "network-attachment-definitions", "net1"), {}),
]


@pytest.mark.parametrize("name, args, kwargs", CASES, ids=[c[0] for c in CASES])
def test_the_same_call_as_the_generated_api(name, args, kwargs):
    ours, theirs = Recording(), Recording()
    options = {"_preload_content": False, "_request_timeout": (10, 10)}
    generated = (client.CustomObjectsApi if "custom" in name else client.CoreV1Api)(theirs)
    assert getattr(ApiCalls(ours), name)(*args, **kwargs, **options) == "sent"
    getattr(generated, name)(*args, **kwargs, **options)
    assert ours.calls == theirs.calls


def test_query_names_as_the_generated_methods_do():
    assert query({"field_selector": "a", "_continue": "c", "limit": None,
                  "allow_watch_bookmarks": True}) == [
        ("fieldSelector", "a"), ("continue", "c"), ("allowWatchBookmarks", True)]


def test_a_generic_get_keeps_the_path_and_query_names():
    recording = Recording()
    path = "/apis/resource.k8s.io/v1/resourceslices"
    ApiCalls(recording).get(path, {"fieldSelector": "spec.nodeName=n,spec.driver=d"},
                            _preload_content=False, _request_timeout=(3, 3))
    [call] = recording.calls
    assert (call["path"], call["method"], call["path_params"]) == (path, "GET", {})
    assert call["query"] == [("fieldSelector", "spec.nodeName=n,spec.driver=d")]
    assert call["auth"] == ["BearerToken"] and call["timeout"] == (3, 3)
    assert call["accept"] == "application/json" and call["preload"] is False

