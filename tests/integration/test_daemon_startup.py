"""Start-up and stop of the real daemon: /healthz before the Kubernetes client, clean exits.

The Kubernetes client is built on a background thread, so /healthz (and with it DEL) never
waits for ``import kubernetes``; a kubeconfig that cannot be used still stops the daemon
with the reason; SIGTERM on an idle daemon exits 0 with its last log line written.
"""

from __future__ import annotations

import signal

import pytest

from harness import start_bound, unit_stop_timeout, watch_bound
from multusd.wire import api
from testlib import wait_for

pytestmark = [pytest.mark.privileged]


def _status(daemon, path: str) -> int:
    return api.http_request(daemon.socket_path, "GET", path, timeout=5).status


def test_healthz_answers_while_the_api_is_down_and_readyz_follows_the_caches(sandbox, kube_api):
    kube_api.stop()
    daemon = sandbox.daemon({"kubeconfig": kube_api.kubeconfig_path, "nodeName": kube_api.node,
                             "clusterNetwork": "/nonexistent/10-cluster.conf"})
    assert _status(daemon, "/healthz") == 200
    assert _status(daemon, "/readyz") == 500
    kube_api.start()
    wait_for(lambda: _status(daemon, "/readyz") == 200, watch_bound(),
             what="/readyz after the API is back")


def test_an_unusable_kubeconfig_stops_the_daemon_with_the_reason(sandbox, tmp_path):
    broken = tmp_path / "kubeconfig"
    broken.write_text("this: [is not a kubeconfig")
    daemon = sandbox.daemon({"kubeconfig": str(broken), "nodeName": "node-a",
                             "clusterNetwork": "/nonexistent/10-cluster.conf"}, activate=False)
    try:
        api.http_request(daemon.socket_path, "GET", "/healthz", timeout=5)  # activates it
    except OSError:
        pass  # it may already be gone
    assert daemon.proc.wait(start_bound() + unit_stop_timeout()) == 3
    assert str(broken) in daemon.log()
    assert "cannot start" in daemon.log()


def test_sigterm_on_an_idle_daemon_exits_0_with_its_log_flushed(sandbox, kube_api):
    daemon = sandbox.daemon({"kubeconfig": kube_api.kubeconfig_path, "nodeName": kube_api.node,
                             "clusterNetwork": "/nonexistent/10-cluster.conf"})
    wait_for(lambda: _status(daemon, "/readyz") == 200, start_bound(), what="/readyz")
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(unit_stop_timeout()) == 0
    assert daemon.log().rstrip().endswith("multusd stopped")
