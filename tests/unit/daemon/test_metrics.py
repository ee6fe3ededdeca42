"""The metrics registry: exposition text, histogram buckets, escaping, threads, daemon series."""

from __future__ import annotations

import os
import re
import threading

import pytest

from multusd.daemon import metrics
from multusd.daemon.metrics import (Counter, DaemonMetrics, Gauge, Histogram, Registry, Sampled,
                             count_scratch_entries, format_value)

# One sample line of format 0.0.4: name, optional {labels}, value.
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE_LINE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*'
    r'(\{' + _PAIR + r'(,' + _PAIR + r')*\})?'
    r' (NaN|[+-]Inf|-?[0-9.]+(e[+-]?[0-9]+)?)$')


def assert_valid_exposition(text: str) -> None:
    """Every line is a HELP/TYPE comment or a well-formed sample; TYPE precedes its samples."""
    assert text.endswith("\n")
    typed: set = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            name, kind = line.split(" ")[2:4]
            assert kind in ("counter", "gauge", "histogram"), line
            typed.add(name)
            continue
        assert SAMPLE_LINE.match(line), f"not a valid sample line: {line!r}"
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or family in typed, f"sample before its TYPE line: {line!r}"


def test_golden_exposition_text():
    registry = Registry()
    requests = registry.register(Counter("demo_requests_total", "Requests served.",
                                         ("handler", "result")))
    in_flight = registry.register(Gauge("demo_in_flight", "Requests now."))
    latency = registry.register(Histogram("demo_seconds", "Latency.", ("command",),
                                          buckets=(0.25, 1, 2.5)))
    registry.register(Sampled("demo_cached", "Cache size.", lambda: 7))
    requests.inc(handler="/cni", result="ok")
    requests.inc(2, handler="/cni", result="ok")
    requests.inc(handler="/readyz", result="error")
    in_flight.inc()
    in_flight.inc()
    in_flight.dec()
    for value in (0.125, 0.25, 1.5, 300):
        latency.observe(value, command="ADD")
    latency.observe(0.5, command="DEL")

    assert registry.render() == (
        "# HELP demo_requests_total Requests served.\n"
        "# TYPE demo_requests_total counter\n"
        'demo_requests_total{handler="/cni",result="ok"} 3\n'
        'demo_requests_total{handler="/readyz",result="error"} 1\n'
        "# HELP demo_in_flight Requests now.\n"
        "# TYPE demo_in_flight gauge\n"
        "demo_in_flight 1\n"
        "# HELP demo_seconds Latency.\n"
        "# TYPE demo_seconds histogram\n"
        'demo_seconds_bucket{command="ADD",le="0.25"} 2\n'
        'demo_seconds_bucket{command="ADD",le="1"} 2\n'
        'demo_seconds_bucket{command="ADD",le="2.5"} 3\n'
        'demo_seconds_bucket{command="ADD",le="+Inf"} 4\n'
        'demo_seconds_sum{command="ADD"} 301.875\n'
        'demo_seconds_count{command="ADD"} 4\n'
        'demo_seconds_bucket{command="DEL",le="0.25"} 0\n'
        'demo_seconds_bucket{command="DEL",le="1"} 1\n'
        'demo_seconds_bucket{command="DEL",le="2.5"} 1\n'
        'demo_seconds_bucket{command="DEL",le="+Inf"} 1\n'
        'demo_seconds_sum{command="DEL"} 0.5\n'
        'demo_seconds_count{command="DEL"} 1\n'
        "# HELP demo_cached Cache size.\n"
        "# TYPE demo_cached gauge\n"
        "demo_cached 7\n"
    )


def test_unlabelled_families_start_at_zero():
    registry = Registry()
    registry.register(Counter("c_total", "c"))
    registry.register(Histogram("h_seconds", "h", buckets=(1,)))
    assert registry.render() == (
        "# HELP c_total c\n# TYPE c_total counter\nc_total 0\n"
        "# HELP h_seconds h\n# TYPE h_seconds histogram\n"
        'h_seconds_bucket{le="1"} 0\nh_seconds_bucket{le="+Inf"} 0\n'
        "h_seconds_sum 0\nh_seconds_count 0\n")


@pytest.mark.parametrize("value, bucket_counts", [
    (0.0, [1, 1, 1, 1]),
    (0.1, [1, 1, 1, 1]),        # equal to a bound: counted in that bucket (le is inclusive)
    (0.1000001, [0, 1, 1, 1]),
    (1.0, [0, 1, 1, 1]),
    (10.0, [0, 0, 1, 1]),
    (10.5, [0, 0, 0, 1]),       # above every bound: only +Inf
    (-3.0, [1, 1, 1, 1]),
])
def test_histogram_bucket_for_one_value(value, bucket_counts):
    histogram = Histogram("h", "h", buckets=(0.1, 1, 10))
    histogram.observe(value)
    cumulative, total, count = histogram.snapshot()
    assert cumulative == bucket_counts
    assert total == value
    assert count == 1


def test_histogram_buckets_are_cumulative_and_sum_and_count_add_up():
    histogram = Histogram("h", "h", ("plugin",), buckets=(0.005, 0.05, 0.5, 5))
    values = [0.001, 0.004, 0.005, 0.02, 0.3, 0.3, 4.9, 7.0, 121.0]
    for value in values:
        histogram.observe(value, plugin="bridge")
    cumulative, total, count = histogram.snapshot(plugin="bridge")
    assert cumulative == [3, 4, 6, 7, 9]
    assert count == len(values)
    assert total == pytest.approx(sum(values))
    assert histogram.snapshot(plugin="macvlan") == ([0, 0, 0, 0, 0], 0.0, 0)


def test_default_duration_buckets_span_5ms_to_120s():
    assert metrics.DURATION_BUCKETS[0] == 0.005
    assert metrics.DURATION_BUCKETS[-1] == 120
    assert list(metrics.DURATION_BUCKETS) == sorted(set(metrics.DURATION_BUCKETS))
    text = Histogram("d_seconds", "d").render()
    les = re.findall(r'le="([^"]+)"', text)
    assert les[0] == "0.005" and les[-2:] == ["120", "+Inf"]
    assert len(les) == len(metrics.DURATION_BUCKETS) + 1


def test_label_values_are_escaped():
    counter = Counter("esc_total", "esc", ("path",))
    counter.inc(path='C:\\dir "quoted"\nnext')
    line = counter.render().splitlines()[-1]
    assert line == 'esc_total{path="C:\\\\dir \\"quoted\\"\\nnext"} 1'
    assert_valid_exposition(counter.render())


def test_help_text_is_escaped_but_keeps_quotes():
    gauge = Gauge("g", 'back\\slash "quoted"\nsecond line')
    assert gauge.render().splitlines()[0] == '# HELP g back\\\\slash "quoted"\\nsecond line'


@pytest.mark.parametrize("value, text", [
    (0, "0"), (3.0, "3"), (-2, "-2"), (0.25, "0.25"), (0.005, "0.005"), (1e16, "1e+16"),
    (float("inf"), "+Inf"), (float("-inf"), "-Inf"), (float("nan"), "NaN"),
])
def test_value_formatting(value, text):
    assert format_value(value) == text


@pytest.mark.parametrize("make, message", [
    (lambda: Counter("1bad", "x"), "metric name '1bad' is not valid"),
    (lambda: Counter("ok", "x", ("bad-label",)), "label name 'bad-label'"),
    (lambda: Counter("ok", "x", ("__reserved",)), "label name '__reserved'"),
    (lambda: Counter("ok", "x", ("a", "a")), "lists a label name twice"),
    (lambda: Histogram("ok", "x", ("le",)), "'le' is reserved in a histogram"),
    (lambda: Histogram("ok", "x", buckets=(1, 0.5)), "must be finite, increasing"),
    (lambda: Histogram("ok", "x", buckets=()), "must be finite, increasing"),
    (lambda: Sampled("ok", "x", kind="histogram"), "'gauge' or a 'counter'"),
])
def test_invalid_definitions_are_refused(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_wrong_labels_negative_increments_and_nan_are_refused():
    counter = Counter("c_total", "c", ("handler",))
    with pytest.raises(ValueError, match=r"takes the labels \['handler'\], got \['code'\]"):
        counter.inc(code="200")
    with pytest.raises(ValueError, match="takes the labels"):
        counter.inc()
    with pytest.raises(ValueError, match="cannot go down"):
        counter.inc(-1, handler="/cni")
    with pytest.raises(ValueError, match="cannot observe NaN"):
        Histogram("h", "h").observe(float("nan"))
    assert counter.get(handler="/cni") == 0


def test_a_name_registers_once():
    registry = Registry()
    registry.register(Counter("dup_total", "first"))
    with pytest.raises(ValueError, match="'dup_total' is already registered"):
        registry.register(Gauge("dup_total", "second"))
    assert registry.get("dup_total").help == "first"


def test_sampled_metric_without_a_usable_value_has_no_sample():
    def broken() -> float:
        raise OSError("cache gone")

    registry = Registry()
    unset = registry.register(Sampled("unset", "u"))
    registry.register(Sampled("broken", "b", broken))
    registry.register(Sampled("none", "n", lambda: None))
    registry.register(Sampled("cpu_seconds_total", "c", lambda: 1.5, kind="counter"))
    text = registry.render()
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "cpu_seconds_total 1.5"]
    assert "# TYPE cpu_seconds_total counter" in text
    unset.set_function(lambda: 42)
    assert "unset 42\n" in registry.render()


def test_threads_incrementing_lose_no_update():
    registry = Registry()
    counter = registry.register(Counter("t_total", "t", ("worker",)))
    histogram = registry.register(Histogram("t_seconds", "t", buckets=(0.5,)))
    gauge = registry.register(Gauge("t_gauge", "t"))
    threads_n, per_thread = 8, 2000
    start = threading.Barrier(threads_n + 1)
    snapshots: list = []

    def work(index: int) -> None:
        start.wait()
        for step in range(per_thread):
            counter.inc(worker=str(index % 2))
            histogram.observe(0.25 if step % 2 else 1.0)
            gauge.inc()
            gauge.dec()

    def scrape() -> None:
        start.wait()
        for _ in range(200):
            snapshots.append(registry.render())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    threads.append(threading.Thread(target=scrape))
    for thread in threads[:-1]:
        thread.start()
    threads[-1].start()
    for thread in threads:
        thread.join()

    total = threads_n * per_thread
    assert counter.get(worker="0") + counter.get(worker="1") == total
    assert histogram.snapshot() == ([total // 2, total], 0.25 * total / 2 + 1.0 * total / 2,
                                    total)
    assert gauge.get() == 0
    # every scrape taken while threads ran is self-consistent: the +Inf bucket equals _count
    for text in snapshots:
        inf = re.search(r'^t_seconds_bucket\{le="\+Inf"\} (\d+)$', text, re.M).group(1)
        count = re.search(r"^t_seconds_count (\d+)$", text, re.M).group(1)
        assert inf == count
        assert_valid_exposition(text)


# -- the daemon's series ----------------------------------------------------------------------

def sample(text: str, line_start: str) -> str:
    """The value of the one sample line starting with ``line_start``."""
    found = [line for line in text.splitlines() if line.startswith(line_start + " ")]
    assert len(found) == 1, f"{line_start!r} in:\n{text}"
    return found[0].rsplit(" ", 1)[1]


def test_daemon_series_are_all_present_and_valid():
    daemon = DaemonMetrics(version="9.9.9")
    text = daemon.registry.render()
    for name in ("multusd_requests_total", "multus_server_request_total",
                 "multusd_request_duration_seconds", "multusd_delegate_duration_seconds",
                 "multusd_requests_in_flight", "multusd_cached_pods", "multusd_cached_nads",
                 "multusd_scratch_cache_entries", "multusd_build_info"):
        assert f"# TYPE {name} " in text
    assert sample(text, 'multusd_build_info{version="9.9.9"}') == "1"
    assert sample(text, "multusd_requests_in_flight") == "0"
    assert_valid_exposition(text)


def test_track_request_counts_outcome_duration_and_in_flight():
    daemon = DaemonMetrics()
    with daemon.track_request("/cni") as tracked:
        tracked.command = "ADD"
        assert daemon.in_flight.get() == 1
    with pytest.raises(RuntimeError):
        with daemon.track_request("/delegate") as tracked:
            tracked.command = "DEL"
            raise RuntimeError("plugin failed")
    with daemon.track_request("/cni") as tracked:  # an error answered without raising
        tracked.command = "CHECK"
        tracked.ok = False

    assert daemon.in_flight.get() == 0
    assert daemon.requests.get(handler="/cni", command="ADD", result="ok") == 1
    assert daemon.requests.get(handler="/delegate", command="DEL", result="error") == 1
    assert daemon.requests.get(handler="/cni", command="CHECK", result="error") == 1
    for command in ("ADD", "DEL", "CHECK"):
        assert daemon.request_duration.snapshot(command=command)[2] == 1
    assert_valid_exposition(daemon.registry.render())


def test_http_answers_use_upstream_labels():
    daemon = DaemonMetrics()
    daemon.observe_http("/cni", "POST", 200)
    daemon.observe_http("/cni", "POST", 400)
    daemon.observe_http("/readyz?x=1", "GET", 500)
    daemon.observe_http("/nope", "GET", 404)
    daemon.observe_http("/healthz", "BREW", 405)
    text = daemon.registry.render()
    upstream = "multus_server_request_total"
    assert sample(text, upstream + '{handler="/cni",code="200",method="post"}') == "1"
    assert sample(text, upstream + '{handler="/cni",code="400",method="post"}') == "1"
    assert sample(text, upstream + '{handler="/readyz",code="500",method="get"}') == "1"
    assert sample(text, upstream + '{handler="NotFound",code="404",method="get"}') == "1"
    assert sample(text, upstream + '{handler="/healthz",code="405",method="unknown"}') == "1"
    # probes and unknown paths are counted in multusd_requests_total too; /cni is not (the
    # daemon counts it with its command through track_request)
    assert daemon.requests.get(handler="/readyz", command="", result="error") == 1
    assert daemon.requests.get(handler="NotFound", command="", result="error") == 1
    assert 'multusd_requests_total{handler="/cni"' not in text


def test_plugin_durations_by_type_and_command():
    daemon = DaemonMetrics()
    daemon.observe_plugin("bridge", "ADD", 0.02)
    daemon.observe_plugin("bridge", "ADD", 0.2)
    daemon.observe_plugin("host-local", "DEL", 0.004)
    cumulative, total, count = daemon.delegate_duration.snapshot(plugin="bridge", command="ADD")
    assert count == 2 and total == pytest.approx(0.22)
    assert cumulative[:4] == [0, 0, 1, 1]  # 5 ms, 10 ms, 25 ms, 50 ms
    assert daemon.delegate_duration.snapshot(plugin="host-local", command="DEL")[0][0] == 1


def test_a_disabled_registry_records_nothing():
    daemon = DaemonMetrics(enabled=False)
    daemon.observe_plugin("bridge", "ADD", 0.1)
    daemon.observe_http("/cni", "POST", 200)
    with daemon.track_request("/cni") as tracked:
        tracked.command = "ADD"
        assert daemon.in_flight.get() == 0
    text = daemon.registry.render()
    assert "multusd_delegate_duration_seconds_bucket" not in text
    assert "multus_server_request_total{" not in text
    assert "multusd_requests_total{" not in text
    daemon.enable()
    daemon.observe_plugin("bridge", "ADD", 0.1)
    assert daemon.delegate_duration.snapshot(plugin="bridge", command="ADD")[2] == 1


def test_module_functions_do_nothing_until_served(monkeypatch):
    monkeypatch.setattr(metrics.DEFAULT, "enabled", False)  # as before any serve()
    plugin = "unit-test-never-recorded"
    metrics.observe_plugin(plugin, "ADD", 0.1)
    metrics.observe_http("/cni", "POST", 200)
    with metrics.track_request("/cni") as tracked:
        tracked.command = "ADD"
    assert metrics.DEFAULT.delegate_duration.snapshot(plugin=plugin, command="ADD")[2] == 0


def test_sources_feed_the_sampled_gauges(tmp_path):
    cni_dir = tmp_path / "multus"
    daemon = DaemonMetrics()
    pods = {"a": 1, "b": 2}
    daemon.set_sources(cached_pods=lambda: len(pods), cached_nads=lambda: 5, cni_dir=str(cni_dir))
    text = daemon.registry.render()
    assert sample(text, "multusd_cached_pods") == "2"
    assert sample(text, "multusd_cached_nads") == "5"
    assert sample(text, "multusd_scratch_cache_entries") == "0"  # not created yet

    (cni_dir / "results").mkdir(parents=True)
    (cni_dir / "results" / "net-abc-eth0").write_text("{}")
    (cni_dir / "abc").write_text("{}")
    (cni_dir / "def").write_text("{}")
    os.symlink(str(cni_dir / "abc"), str(cni_dir / "link"))
    pods["c"] = 3
    text = daemon.registry.render()
    assert sample(text, "multusd_cached_pods") == "3"
    assert sample(text, "multusd_scratch_cache_entries") == "2"

    daemon.set_sources()  # no sources: the gauges go empty instead of showing stale values
    text = daemon.registry.render()
    assert not re.search(r"^multusd_cached_pods ", text, re.M)


def test_scratch_count_of_an_unreadable_path_is_unknown(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert count_scratch_entries(str(not_a_dir)) is None
    assert count_scratch_entries(str(tmp_path / "missing")) == 0
