"""The /metrics endpoint over real TCP: content type, series, 404, port in use, close."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request

import pytest

from multusd.daemon import metrics
from multusd.daemon.metrics import DaemonMetrics, MetricsServerError, serve
from testlib import unique


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
    assert 'multus_server_request_total{handler="/cni",code="200",method="post"} 1\n' in body
    assert 'multusd_requests_total{handler="/cni",command="ADD",result="ok"} 1\n' in body
    assert 'multusd_request_duration_seconds_count{command="ADD"} 1\n' in body
    assert ('multusd_delegate_duration_seconds_bucket{plugin="bridge",command="ADD",le="0.05"} 1\n'
            in body)
    assert 'multusd_build_info{version="1.2.3"} 1\n' in body
    assert "multusd_requests_in_flight 0\n" in body


def test_each_scrape_sees_the_current_values(server, daemon_metrics):
    url = server.url
    assert url == f"http://127.0.0.1:{server.port}/metrics"
    daemon_metrics.set_sources(cached_pods=lambda: 4)
    assert "multusd_cached_pods 4\n" in get(url)[2]
    daemon_metrics.set_sources(cached_pods=lambda: 9)
    assert "multusd_cached_pods 9\n" in get(url)[2]


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
    assert 'multusd_delegate_duration_seconds_count{plugin="macvlan",command="ADD"} 60\n' in final


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
        assert running.address == metrics.DEFAULT_ADDRESS == "127.0.0.1"
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


def test_serving_the_default_registry_enables_the_module_functions(monkeypatch):
    monkeypatch.setattr(metrics.DEFAULT, "enabled", False)  # restored afterwards
    plugin = unique("plugin-")
    metrics.observe_plugin(plugin, "ADD", 0.01)  # before serve(): dropped
    with serve("127.0.0.1", 0) as running:
        metrics.observe_plugin(plugin, "ADD", 0.01)
        body = get(running.url)[2]
    assert f'multusd_delegate_duration_seconds_count{{plugin="{plugin}",command="ADD"}} 1\n' in body


def test_a_failing_render_is_a_500_and_the_server_keeps_serving():
    class Broken(metrics.Gauge):
        fail = True

        def samples(self) -> list:
            if self.fail:
                raise RuntimeError("broken metric")
            return super().samples()

    registry = metrics.Registry()
    broken = registry.register(Broken("broken", "b"))
    with serve("127.0.0.1", 0, registry=registry) as running:
        status, _, body = get(running.url)
        assert status == 500 and "see the multusd log" in body
        broken.fail = False
        assert get(running.url)[:2] == (200, metrics.CONTENT_TYPE)
