"""The /metrics endpoint over real TCP: content type, series, 404, port in use, close."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request

import prometheus_client
import pytest

from multusd.cni import invoke
from multusd.daemon import metrics
from multusd.daemon.metrics import DaemonMetrics
from multusd.daemon.metricsserver import DEFAULT_ADDRESS, MetricsServerError, serve
from testlib import metric_value


def get(url: str) -> tuple:
    """(status, content type, body text) of a GET, also for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture
def daemon_metrics():
    return DaemonMetrics(version="1.2.3")


@pytest.fixture
def server(daemon_metrics):
    running = serve("127.0.0.1", 0, registry=daemon_metrics.registry)
    yield running
    running.close()


def test_scrape_has_the_content_type_and_the_series(server, daemon_metrics):
    assert server.address == "127.0.0.1"
    assert server.port > 0  # port 0 asked for a free one; the bound port is reported
    daemon_metrics.observe_http("/cni", "POST", 200)
    with daemon_metrics.track_request("/cni") as tracked:
        tracked.command = "ADD"
    daemon_metrics.observe_plugin("bridge", "ADD", 0.03)

    status, content_type, body = get(f"http://127.0.0.1:{server.port}/metrics")

    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert metric_value(body, "multus_server_request_total", handler="/cni", code="200",
                        method="post") == 1
    assert metric_value(body, "multusd_requests_total", handler="/cni", command="ADD",
                        result="ok") == 1
    assert metric_value(body, "multusd_request_duration_seconds_count", command="ADD") == 1
    assert metric_value(body, "multusd_delegate_duration_seconds_bucket", plugin="bridge",
                        command="ADD", le="0.05") == 1
    assert metric_value(body, "multusd_build_info", version="1.2.3") == 1
    assert metric_value(body, "multusd_requests_in_flight") == 0
    assert "_created" not in body


def test_each_scrape_sees_the_current_values(server, daemon_metrics):
    url = server.url
    assert url == f"http://127.0.0.1:{server.port}/metrics"
    daemon_metrics.set_sources(cached_pods=lambda: 4)
    assert metric_value(get(url)[2], "multusd_cached_pods") == 4
    daemon_metrics.set_sources(cached_pods=lambda: 9)
    assert metric_value(get(url)[2], "multusd_cached_pods") == 9


def test_the_server_header_names_no_python_version(server):
    for path in ("/metrics", "/nope"):
        try:
            with urllib.request.urlopen(server.url.replace("/metrics", path), timeout=10) as r:
                header = r.headers["Server"]
        except urllib.error.HTTPError as exc:
            with exc:
                header = exc.headers["Server"]
        assert header == "multusd", path


def test_other_paths_are_404(server):
    status, _, body = get(f"http://127.0.0.1:{server.port}/debug/pprof/")
    assert status == 404
    assert "not found" in body
    assert get(f"http://127.0.0.1:{server.port}/metrics?x=1")[0] == 200


def test_concurrent_scrapes_all_succeed(server, daemon_metrics):
    results: list = []

    def scrape() -> None:
        for _ in range(10):
            daemon_metrics.observe_plugin("macvlan", "ADD", 0.01)
            results.append(get(server.url)[0])

    threads = [threading.Thread(target=scrape) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 60
    final = get(server.url)[2]
    assert metric_value(final, "multusd_delegate_duration_seconds_count", plugin="macvlan",
                        command="ADD") == 60


def test_port_in_use_names_the_port_and_the_key():
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(MetricsServerError) as caught:
            serve("127.0.0.1", port, registry=DaemonMetrics().registry)
    finally:
        holder.close()
    message = str(caught.value)
    assert f"port {port} is already in use" in message
    assert '"metricsPort"' in message and "daemon-config.json" in message


def test_an_address_not_on_this_host_names_metrics_address():
    with pytest.raises(MetricsServerError, match='fix "metricsAddress" in daemon-config.json'):
        serve("192.0.2.1", 0, registry=DaemonMetrics().registry)  # TEST-NET-1, never local


def test_close_stops_serving_and_frees_the_port():
    running = serve("127.0.0.1", 0, registry=DaemonMetrics().registry)
    port = running.port
    assert get(running.url)[0] == 200
    running.close()
    running.close()  # a second close is harmless
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    again = serve("127.0.0.1", port, registry=DaemonMetrics().registry)
    try:
        assert again.port == port
    finally:
        again.close()


def test_empty_address_means_loopback():
    with serve("", 0, registry=DaemonMetrics().registry) as running:
        assert running.address == DEFAULT_ADDRESS == "127.0.0.1"
        assert get(running.url)[0] == 200


def test_ipv6_loopback():
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with serve("::1", 0, registry=DaemonMetrics().registry) as running:
        assert running.url == f"http://[::1]:{running.port}/metrics"
        assert get(running.url)[0] == 200


def test_plugin_runs_reach_the_daemon_that_handed_out_the_observer(stub_bin):
    # two daemons' metrics in one process: each /metrics shows only its own plugin runs
    mine, other = DaemonMetrics(), DaemonMetrics()
    plugin = os.path.join(stub_bin, "stub-record")
    env = invoke.build_env("ADD", "cid1", "", "eth0", "", stub_bin)
    invoke.exec_plugin(plugin, command="ADD", stdin=b'{"cniVersion": "1.0.0"}', env=env,
                       deadline=time.monotonic() + 30, observer=mine.observe_plugin)
    with serve("127.0.0.1", 0, registry=mine.registry) as running, \
            serve("127.0.0.1", 0, registry=other.registry) as elsewhere:
        body, other_body = get(running.url)[2], get(elsewhere.url)[2]
    count = "multusd_delegate_duration_seconds_count"
    assert metric_value(body, count, plugin="stub-record", command="ADD") == 1
    assert metric_value(other_body, count, plugin="stub-record", command="ADD") is None


def test_a_failing_render_is_a_500_and_the_server_keeps_serving():
    class Broken:
        fail = True

        def collect(self) -> list:
            if self.fail:
                raise RuntimeError("broken metric")
            return [prometheus_client.core.GaugeMetricFamily("broken", "b", value=1)]

    registry = prometheus_client.CollectorRegistry()
    broken = Broken()
    registry.register(broken)
    with serve("127.0.0.1", 0, registry=registry) as running:
        status, _, body = get(running.url)
        assert status == 500 and "see the multusd log" in body
        broken.fail = False
        status, content_type, body = get(running.url)
        assert (status, content_type) == (200, metrics.CONTENT_TYPE)
        assert metric_value(body, "broken") == 1
