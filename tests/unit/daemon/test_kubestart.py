"""multusd.daemon.kubestart: the client built in the background; only what says so waits."""

from __future__ import annotations

import threading

import pytest

from harness import start_bound
from multusd.daemon.kubestart import BackgroundKube
from multusd.errors import TryAgainLater
from testlib import wait_for

NS = "default"


def test_before_it_is_built_nothing_waits_but_wait_for_client(tmp_path):
    kube = BackgroundKube(str(tmp_path / "kubeconfig"), "node-a", on_failure=lambda: None)
    kube.BUILD_WAIT = 0.05  # never started: the wait ends unanswered
    assert not kube.ready() and not kube.synced()
    assert kube.last_error == "the Kubernetes client is still starting"
    assert str(tmp_path / "kubeconfig") in kube.server_url
    with pytest.raises(TryAgainLater) as info:
        kube.get_pod(NS, "web")
    assert "still starting" in info.value.msg
    assert not hasattr(kube, "cache_sizes")  # no attribute reaches the client by a side door


def test_a_kubeconfig_that_cannot_be_loaded_fails_the_waits_at_once(tmp_path):
    failed = threading.Event()
    kube = BackgroundKube(str(tmp_path / "missing"), "node-a", on_failure=failed.set)
    kube.start_building()
    assert failed.wait(10)
    assert "missing" in kube.failure
    with pytest.raises(TryAgainLater) as info:
        kube.wait_for_client()  # built (and failed): no wait of BUILD_WAIT
    assert kube.failure in info.value.msg


def test_once_built_the_lookups_reach_the_client(kube_api):
    kube_api.add_pod(NS, "web")
    built = threading.Event()
    kube = BackgroundKube(kube_api.kubeconfig_path, kube_api.node, on_failure=lambda: None,
                          on_built=built.set)
    kube.start_building()
    try:
        assert built.wait(start_bound())
        assert kube.wait_for_client() is kube.client
        assert kube.server_url == kube_api.url
        wait_for(kube.ready, start_bound(), what="the pod cache's first list")
        assert kube.get_pod(NS, "web").name == "web"
        assert kube.get_nad(NS, "absent") is None
    finally:
        kube.stop()


def test_a_pod_listener_is_on_the_client_before_its_first_list(kube_api):
    kube_api.add_pod(NS, "web")
    seen = []
    kube = BackgroundKube(kube_api.kubeconfig_path, kube_api.node, on_failure=lambda: None,
                          pod_listener=seen.append)
    kube.start_building()
    try:
        wait_for(kube.ready, start_bound(), what="the pod cache's first list")
        assert [(p.namespace, p.name) for p in seen] == [(NS, "web")]
    finally:
        kube.stop()
