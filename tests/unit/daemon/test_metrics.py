"""The daemon's series on prometheus_client: exposition text, buckets, escaping, threads, no-op."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import prometheus_client
import pytest

from multusd.daemon import metrics
from multusd.daemon.metrics import DaemonMetrics, NullMetrics, count_scratch_entries
from testlib import REPO

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


def sample(text: str, line_start: str) -> str:
    """The value of the one sample line starting with ``line_start``."""
    found = [line for line in text.splitlines() if line.startswith(line_start + " ")]
    assert len(found) == 1, f"{line_start!r} in:\n{text}"
    return found[0].rsplit(" ", 1)[1]


def value(daemon: DaemonMetrics, name: str, **labels: str) -> float:
    """One sample of ``daemon``'s registry; 0 for a series never touched."""
    found = daemon.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def buckets(daemon: DaemonMetrics, name: str, **labels: str) -> list:
    """The cumulative bucket counts of one histogram series, finite bounds then +Inf."""
    bounds = [repr(float(bound)) for bound in metrics.DURATION_BUCKETS] + ["+Inf"]
    return [value(daemon, name + "_bucket", **labels, le=bound) for bound in bounds]


def test_a_fresh_daemon_exposes_every_family_and_nothing_else():
    assert DaemonMetrics(version="9.9.9").render() == (
        "# HELP multusd_requests_total Requests answered, by endpoint, CNI command and outcome.\n"
        "# TYPE multusd_requests_total counter\n"
        "# HELP multus_server_request_total Counter of HTTP requests (upstream Multus's series).\n"
        "# TYPE multus_server_request_total counter\n"
        "# HELP multusd_request_duration_seconds Time spent on a /cni or /delegate request, by "
        "CNI command.\n"
        "# TYPE multusd_request_duration_seconds histogram\n"
        "# HELP multusd_delegate_duration_seconds Time one delegate plugin execution took, by "
        "plugin type and CNI command.\n"
        "# TYPE multusd_delegate_duration_seconds histogram\n"
        "# HELP multusd_requests_in_flight CNI requests being processed now.\n"
        "# TYPE multusd_requests_in_flight gauge\n"
        "multusd_requests_in_flight 0.0\n"
        "# HELP multusd_cached_pods Pods of this node in the watch cache.\n"
        "# TYPE multusd_cached_pods gauge\n"
        "# HELP multusd_cached_nads NetworkAttachmentDefinitions in the watch cache.\n"
        "# TYPE multusd_cached_nads gauge\n"
        "# HELP multusd_scratch_cache_entries Sandboxes recorded in the scratch cache (cniDir).\n"
        "# TYPE multusd_scratch_cache_entries gauge\n"
        "# HELP multusd_stale_sandboxes Sandboxes whose network namespace is gone (multusd gc).\n"
        "# TYPE multusd_stale_sandboxes gauge\n"
        "# HELP multusd_unreleased_sandboxes Sandboxes whose DEL kept failing past "
        "deleteRetryWindow: answered success, their records kept for multusd gc (multusd "
        "status lists them).\n"
        "# TYPE multusd_unreleased_sandboxes gauge\n"
        "# HELP multusd_pod_cache_misses_total Pod lookups the watch cache could not answer "
        "(one live GET each).\n"
        "# TYPE multusd_pod_cache_misses_total counter\n"
        "# HELP multusd_node_name_mismatch 1 when this node's pods are scheduled on another node "
        "name than the one watched (the log names both); set nodeName.\n"
        "# TYPE multusd_node_name_mismatch gauge\n"
        "# HELP multusd_watch_relists_total Watches that expired (410 Gone, lost history) and "
        "were listed again.\n"
        "# TYPE multusd_watch_relists_total counter\n"
        "# HELP multusd_nad_api_unavailable 1 while the NetworkAttachmentDefinition watch fails "
        "(CRD not installed, forbidden, or not answering: multusd status says which).\n"
        "# TYPE multusd_nad_api_unavailable gauge\n"
        "# HELP multusd_nad_refusals_total ADDs refused because the NetworkAttachmentDefinition "
        "API is not installed or not readable with the node's credentials.\n"
        "# TYPE multusd_nad_refusals_total counter\n"
        "# HELP multusd_credential_rotations_total Rotated credentials found and used (token "
        "file, client certificate, plugin).\n"
        "# TYPE multusd_credential_rotations_total counter\n"
        "# HELP multusd_kube_request_retries_total Requests to the API server sent again after a "
        "transient failure, by cause (429, 5xx, refused, reset, closed, tls-eof, proxy).\n"
        "# TYPE multusd_kube_request_retries_total counter\n"
        "# HELP multusd_watch_reopens_total Watches of the API server that ended and were opened "
        "again, by resource and cause (ended: by the server at its timeout; expired: 410 or lost "
        "history, then a relist; error: an ERROR event or an error answer; connection: the "
        "connection failed or was cut; silence: nothing arrived within the silence bound).\n"
        "# TYPE multusd_watch_reopens_total counter\n"
        "# HELP multusd_build_info Always 1; the version label says which multusd runs.\n"
        "# TYPE multusd_build_info gauge\n"
        'multusd_build_info{version="9.9.9"} 1.0\n'
    )


def test_golden_histogram_and_counter_text_without_created_samples():
    daemon = DaemonMetrics()
    daemon.observe_plugin("bridge", "ADD", 0.02)
    daemon.observe_plugin("bridge", "ADD", 0.2)
    daemon.observe_plugin("bridge", "ADD", 300)
    daemon.observe_http("/healthz", "GET", 200)
    text = daemon.render()
    assert "_created" not in text  # prometheus_client's extra series; upstream has none
    # prometheus_client writes labels sorted by name and every value as a float
    name = "multusd_delegate_duration_seconds"
    counts = [0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    expected = [f'{name}_bucket{{command="ADD",le="{bound!r}",plugin="bridge"}} {count}.0'
                for bound, count in zip(metrics.DURATION_BUCKETS, counts)]
    expected += [f'{name}_bucket{{command="ADD",le="+Inf",plugin="bridge"}} 3.0',
                 f'{name}_count{{command="ADD",plugin="bridge"}} 3.0',
                 f'{name}_sum{{command="ADD",plugin="bridge"}} 300.22']
    assert [line for line in text.splitlines()
            if line.startswith("multusd_delegate_duration_seconds_")] == expected
    assert 'multusd_requests_total{command="",handler="/healthz",result="ok"} 1.0\n' in text
    assert_valid_exposition(text)


@pytest.mark.parametrize("seconds, first_buckets", [
    (0.0, [1, 1, 1]),
    (0.005, [1, 1, 1]),         # equal to a bound: counted in that bucket (le is inclusive)
    (0.0050001, [0, 1, 1]),
    (0.01, [0, 1, 1]),
    (0.02, [0, 0, 1]),
])
def test_histogram_bucket_for_one_value(seconds, first_buckets):
    daemon = DaemonMetrics()
    daemon.observe_plugin("macvlan", "DEL", seconds)
    counts = buckets(daemon, "multusd_delegate_duration_seconds", plugin="macvlan",
                     command="DEL")
    assert counts[:3] == first_buckets
    assert counts[-1] == 1
    assert value(daemon, "multusd_delegate_duration_seconds_sum", plugin="macvlan",
                 command="DEL") == seconds


def test_above_every_bound_counts_only_in_inf():
    daemon = DaemonMetrics()
    daemon.observe_request("/cni", "ADD", True, 121.0)
    assert buckets(daemon, "multusd_request_duration_seconds", command="ADD") == [0] * 15 + [1]


def test_default_duration_buckets_span_5ms_to_120s():
    assert metrics.DURATION_BUCKETS[0] == 0.005
    assert metrics.DURATION_BUCKETS[-1] == 120
    assert list(metrics.DURATION_BUCKETS) == sorted(set(metrics.DURATION_BUCKETS))
    daemon = DaemonMetrics()
    daemon.observe_request("/cni", "DEL", True, 0.1)
    les = re.findall(r'le="([^"]+)"', daemon.render())
    assert les[0] == "0.005" and les[-2:] == ["120.0", "+Inf"]
    assert len(les) == len(metrics.DURATION_BUCKETS) + 1


def test_label_values_are_escaped():
    daemon = DaemonMetrics()
    daemon.observe_plugin('C:\\dir "quoted"\nnext', "ADD", 0.1)
    text = daemon.render()
    assert ('multusd_delegate_duration_seconds_count'
            '{command="ADD",plugin="C:\\\\dir \\"quoted\\"\\nnext"} 1.0') in text.splitlines()
    assert_valid_exposition(text)


def test_threads_recording_lose_no_update():
    daemon = DaemonMetrics()
    threads_n, per_thread = 8, 500
    start = threading.Barrier(threads_n + 1)
    snapshots: list = []

    def work(index: int) -> None:
        start.wait()
        for step in range(per_thread):
            daemon.observe_plugin("bridge", "ADD", 0.25 if step % 2 else 1.0)
            daemon.observe_http("/cni", "POST", 200 + index % 2)
            with daemon.track_request("/cni") as tracked:
                tracked.command = "ADD"

    def scrape() -> None:
        start.wait()
        for _ in range(100):
            snapshots.append(daemon.render())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    threads.append(threading.Thread(target=scrape))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    total = threads_n * per_thread
    bridge = {"plugin": "bridge", "command": "ADD"}
    assert value(daemon, "multusd_delegate_duration_seconds_count", **bridge) == total
    assert value(daemon, "multusd_delegate_duration_seconds_bucket", **bridge,
                 le="0.25") == total // 2
    assert value(daemon, "multusd_delegate_duration_seconds_sum", **bridge) == (
        0.25 * total / 2 + 1.0 * total / 2)
    assert sum(value(daemon, "multus_server_request_total", handler="/cni", code=code,
                     method="post") for code in ("200", "201")) == total
    assert value(daemon, "multusd_requests_total", handler="/cni", command="ADD",
                 result="ok") == total
    assert value(daemon, "multusd_requests_in_flight") == 0
    for text in snapshots:  # every scrape taken while threads ran is well formed
        assert_valid_exposition(text)


def test_each_daemon_has_its_own_registry():
    first, second = DaemonMetrics(version="1"), DaemonMetrics(version="2")
    first.observe_plugin("bridge", "ADD", 0.1)
    assert value(first, "multusd_delegate_duration_seconds_count", plugin="bridge",
                 command="ADD") == 1
    assert value(second, "multusd_delegate_duration_seconds_count", plugin="bridge",
                 command="ADD") == 0
    assert prometheus_client.REGISTRY.get_sample_value("multusd_build_info",
                                                       {"version": "1"}) is None


def test_track_request_counts_outcome_duration_and_in_flight():
    daemon = DaemonMetrics()
    with daemon.track_request("/cni") as tracked:
        tracked.command = "ADD"
        assert value(daemon, "multusd_requests_in_flight") == 1
    with pytest.raises(RuntimeError):
        with daemon.track_request("/delegate") as tracked:
            tracked.command = "DEL"
            raise RuntimeError("plugin failed")
    with daemon.track_request("/cni") as tracked:  # an error answered without raising
        tracked.command = "CHECK"
        tracked.ok = False

    assert value(daemon, "multusd_requests_in_flight") == 0
    requests = "multusd_requests_total"
    assert value(daemon, requests, handler="/cni", command="ADD", result="ok") == 1
    assert value(daemon, requests, handler="/delegate", command="DEL", result="error") == 1
    assert value(daemon, requests, handler="/cni", command="CHECK", result="error") == 1
    assert value(daemon, requests, handler="/cni", command="ADD", result="error") == 0
    for command in ("ADD", "DEL", "CHECK"):
        assert value(daemon, "multusd_request_duration_seconds_count", command=command) == 1
    assert_valid_exposition(daemon.render())


def test_http_answers_use_upstream_labels():
    daemon = DaemonMetrics()
    daemon.observe_http("/cni", "POST", 200)
    daemon.observe_http("/cni", "POST", 400)
    daemon.observe_http("/readyz?x=1", "GET", 500)
    daemon.observe_http("/nope", "GET", 404)
    daemon.observe_http("/healthz", "BREW", 405)
    daemon.observe_http("/forget", "POST", 200)  # multusd's own; counted as /cni is
    text = daemon.render()
    upstream = "multus_server_request_total"
    assert sample(text, upstream + '{code="200",handler="/cni",method="post"}') == "1.0"
    assert sample(text, upstream + '{code="400",handler="/cni",method="post"}') == "1.0"
    assert sample(text, upstream + '{code="500",handler="/readyz",method="get"}') == "1.0"
    assert sample(text, upstream + '{code="404",handler="NotFound",method="get"}') == "1.0"
    assert sample(text, upstream + '{code="405",handler="/healthz",method="unknown"}') == "1.0"
    # probes and unknown paths are counted in multusd_requests_total too; /cni is not (the
    # daemon counts it with its command through track_request)
    requests = "multusd_requests_total"
    assert value(daemon, requests, handler="/readyz", command="", result="error") == 1
    assert value(daemon, requests, handler="NotFound", command="", result="error") == 1
    assert not re.search(r'^multusd_requests_total\{[^}]*handler="/cni"', text, re.M)
    assert sample(text, upstream + '{code="200",handler="/forget",method="post"}') == "1.0"
    assert not re.search(r'^multusd_requests_total\{[^}]*handler="(/forget|NotFound)",'
                         r'command="",result="ok"', text, re.M)


def test_plugin_durations_by_type_and_command():
    daemon = DaemonMetrics()
    daemon.observe_plugin("bridge", "ADD", 0.02, "ok")
    daemon.observe_plugin("bridge", "ADD", 0.2, "error")  # failed runs are timed too
    daemon.observe_plugin("host-local", "DEL", 0.004)
    bridge = {"plugin": "bridge", "command": "ADD"}
    assert value(daemon, "multusd_delegate_duration_seconds_count", **bridge) == 2
    assert value(daemon, "multusd_delegate_duration_seconds_sum", **bridge) == \
        pytest.approx(0.22)
    assert buckets(daemon, "multusd_delegate_duration_seconds", **bridge)[:4] == [0, 0, 1, 1]
    assert buckets(daemon, "multusd_delegate_duration_seconds", plugin="host-local",
                   command="DEL")[0] == 1


def test_null_metrics_take_every_call_and_keep_nothing():
    null = NullMetrics()
    assert null.enabled is False
    null.observe_plugin("bridge", "ADD", 0.1, "ok")
    null.observe_http("/cni", "POST", 200)
    null.observe_request("/cni", "ADD", True, 0.1)
    null.set_sources(cached_pods=lambda: 1, cni_dirs=lambda: ["/nonexistent"])
    with null.track_request("/cni") as tracked:
        tracked.command = "ADD"
    assert (tracked.handler, tracked.command) == ("/cni", "ADD")
    with pytest.raises(RuntimeError, match="passes through"):
        with null.track_request("/delegate"):
            raise RuntimeError("passes through")
    assert not hasattr(null, "registry")


def test_metrics_off_never_imports_prometheus_client():
    # what the daemon loads with metricsPort unset, then a request recorded into NullMetrics;
    # the engine must not pull in the daemon layer either (it is handed an observer)
    probe = (
        "import sys\n"
        "import multusd.cni.conflist, multusd.core.multus\n"
        "assert not [m for m in sys.modules if m.startswith('multusd.daemon')], sys.modules\n"
        "from multusd.daemon import lifecycle, metrics\n"
        "null = metrics.NullMetrics()\n"
        "with null.track_request('/cni') as tracked:\n"
        "    tracked.command = 'ADD'\n"
        "null.observe_http('/cni', 'POST', 200)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prometheus_client'))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_sources_feed_the_sampled_gauges(tmp_path):
    cni_dir = tmp_path / "multus"
    daemon = DaemonMetrics()
    pods = {"a": 1, "b": 2}
    node = [str(cni_dir)]  # every cniDir the node names, as it resolves at each scrape
    daemon.set_sources(cached_pods=lambda: len(pods), cached_nads=lambda: 5,
                       cni_dirs=lambda: node)
    text = daemon.render()
    assert sample(text, "multusd_cached_pods") == "2.0"
    assert sample(text, "multusd_cached_nads") == "5.0"
    assert sample(text, "multusd_scratch_cache_entries") == "0.0"  # not created yet

    (cni_dir / "results").mkdir(parents=True)
    (cni_dir / "results" / "net-abc-eth0").write_text("{}")
    (cni_dir / "abc").write_text("{}")
    (cni_dir / "def").write_text("{}")
    os.symlink(str(cni_dir / "abc"), str(cni_dir / "link"))
    pods["c"] = 3
    text = daemon.render()
    assert sample(text, "multusd_cached_pods") == "3.0"
    assert sample(text, "multusd_scratch_cache_entries") == "2.0"
    other = tmp_path / "static"  # the runtime's multus config names another one
    other.mkdir()
    (other / "ghi").write_text("{}")
    node[:] = [str(cni_dir), str(other), str(cni_dir) + "/"]  # each counted once
    assert sample(daemon.render(), "multusd_scratch_cache_entries") == "3.0"

    daemon.set_sources()  # no sources: the gauges go empty instead of showing stale values
    text = daemon.render()
    assert not re.search(r"^multusd_cached_pods ", text, re.M)
    assert "# TYPE multusd_cached_pods gauge\n" in text


def test_api_retries_are_counted_by_cause():
    retries = {"503": 2, "429": 1}
    daemon = DaemonMetrics()
    daemon.set_sources(kube_request_retries=lambda: retries)
    text = daemon.render()
    assert sample(text, 'multusd_kube_request_retries_total{cause="503"}') == "2.0"
    assert sample(text, 'multusd_kube_request_retries_total{cause="429"}') == "1.0"
    assert_valid_exposition(text)
    daemon.set_sources(kube_request_retries=lambda: None)  # the client is not built yet
    assert "\nmultusd_kube_request_retries_total{" not in daemon.render()


def test_watch_reopens_are_one_series_per_resource_and_cause():
    reopens = {("pods", "ended"): 3, ("network-attachment-definitions", "expired"): 1}
    daemon = DaemonMetrics()
    daemon.set_sources(watch_reopens=lambda: reopens)
    name = "multusd_watch_reopens_total"
    assert value(daemon, name, resource="pods", cause="ended") == 3
    assert value(daemon, name, resource="network-attachment-definitions", cause="expired") == 1
    reopens[("pods", "silence")] = 1
    assert value(daemon, name, resource="pods", cause="silence") == 1
    daemon.set_sources(watch_reopens=lambda: 1 / 0)  # a broken source: no samples, no failure
    assert "multusd_watch_reopens_total{" not in daemon.render()


def test_a_sampled_gauge_without_a_usable_value_has_no_sample():
    def broken() -> float:
        raise OSError("cache gone")

    daemon = DaemonMetrics()
    daemon.set_sources(cached_pods=broken, cached_nads=lambda: None, cni_dirs=None)
    text = daemon.render()
    for name in ("multusd_cached_pods", "multusd_cached_nads", "multusd_scratch_cache_entries"):
        assert f"# TYPE {name} gauge\n" in text
        assert not re.search(rf"^{name} ", text, re.M)
    assert_valid_exposition(text)


def test_scratch_count_of_an_unreadable_path_is_unknown(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert count_scratch_entries(str(not_a_dir)) is None
    assert count_scratch_entries(str(tmp_path / "missing")) == 0


def test_stale_sandboxes_gauge_counts_records_whose_netns_is_gone(tmp_path):
    from multusd.cni import resultcache

    cni_dir = str(tmp_path / "multus")
    daemon = DaemonMetrics()
    daemon.set_sources(cni_dirs=lambda: [cni_dir, str(tmp_path / "absent")])
    assert sample(daemon.render(), "multusd_stale_sandboxes") == "0.0"
    for cid, netns in (("live", "/proc/self/ns/net"), ("gone", str(tmp_path / "no-such-netns"))):
        rt = resultcache.RuntimeConf(container_id=cid, netns=netns, ifname="eth0",
                                     cache_dir=cni_dir)
        resultcache.write(cni_dir, "net", rt, b'{"cniVersion":"1.0.0","name":"net","type":"x"}',
                          {"cniVersion": "1.0.0"})
    assert sample(daemon.render(), "multusd_stale_sandboxes") == "1.0"
    daemon.set_sources()
    assert "\nmultusd_stale_sandboxes " not in daemon.render()  # no source, no sample


def test_dynamic_reconciliations_exist_only_with_their_source():
    daemon = DaemonMetrics()
    assert "multusd_dynamic_reconciliations_total" not in daemon.render()  # the key is off
    counts = {"changed": 2, "failed": 1, "unchanged": 0}
    daemon.set_sources(dynamic_reconciliations=lambda: counts)
    name = "multusd_dynamic_reconciliations_total"
    assert value(daemon, name, outcome="changed") == 2
    assert value(daemon, name, outcome="failed") == 1
    assert value(daemon, name, outcome="unchanged") == 0
    assert_valid_exposition(daemon.render())


def test_the_unreleased_gauge_counts_every_cni_dir_the_node_names_and_the_spare_one(tmp_path):
    from failingdel import FAILED, del_request, write_records
    from multusd.core import delmarks, unreleased

    runtime, daemons = str(tmp_path / "static"), str(tmp_path / "multus")
    spare = delmarks.spare_marks_dir(str(tmp_path / "run"))
    write_records(runtime, "in-runtime")      # recorded in the runtime config's cniDir
    write_records(daemons, "in-daemons")
    write_records(daemons, "in-spare")
    for cni_dir, cid in ((runtime, "in-runtime"), (daemons, "in-daemons"), (runtime, "stray"),
                         (runtime, "in-spare")):
        unreleased.record(cni_dir, del_request(cni_dir, cid), FAILED, "m", window=1, now=1.0)
    os.replace(os.path.join(runtime, ".multusd-unreleased", "in-spare"),  # kept by the socket
               os.path.join(os.makedirs(spare) or spare, "in-spare"))
    node = [daemons]
    daemon = DaemonMetrics()
    daemon.set_sources(cni_dirs=lambda: node, marks_spare=spare)
    assert sample(daemon.render(), "multusd_unreleased_sandboxes") == "2.0"
    node.append(runtime)  # "stray" has no records anywhere: not counted
    assert sample(daemon.render(), "multusd_unreleased_sandboxes") == "3.0"
