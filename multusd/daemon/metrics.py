"""Prometheus metrics: the daemon's series on a private prometheus_client registry.

Series (see :class:`DaemonMetrics`)::

    multusd_requests_total{handler,command,result}   counter, result ok|error
    multus_server_request_total{handler,code,method} counter, upstream's name and labels
    multusd_request_duration_seconds{command}        histogram
    multusd_delegate_duration_seconds{plugin,command} histogram, one per plugin exec
    multusd_requests_in_flight                       gauge
    multusd_cached_pods / multusd_cached_nads        gauges, read from the watch caches
    multusd_scratch_cache_entries                    gauge, files in every cniDir the node names
    multusd_stale_sandboxes                          gauge, sandboxes whose netns is gone
    multusd_unreleased_sandboxes                     gauge, DEL answered success after failing
    multusd_pod_cache_misses_total / multusd_watch_relists_total  counters, from the caches
    multusd_watch_reopens_total{resource,cause}      counter, watches ended and opened again
    multusd_nad_api_unavailable                      gauge, 1 while the NAD watch fails
    multusd_nad_refusals_total                       counter, ADDs refused: no NAD CRD/access
    multusd_credential_rotations_total               counter, rotated credentials picked up
    multusd_kube_request_retries_total{cause}        counter, API requests sent again, by cause
    multusd_node_name_mismatch                       gauge, 1 when the watched name is wrong
    multusd_dynamic_reconciliations_total{outcome}   counter, with enableDynamicNetworks only
    multusd_build_info{version}                      always 1

Usage from the daemon (each daemon has its own registry, so tests run several in one process)::

    recorder = metrics.DaemonMetrics() if config.metrics_port is not None else metrics.NullMetrics()
    engine = Engine(bin_dirs, observer=recorder.observe_plugin)   # cni/ only sees a callable
    server = metricsserver.serve(config.metrics_address, config.metrics_port,
                                 registry=recorder.registry)
    with recorder.track_request("/cni") as tracked:
        tracked.command = "ADD"
        ...
    server.close()

``prometheus_client`` is imported only when a :class:`DaemonMetrics` is made or
:func:`multusd.daemon.metricsserver.serve` runs: with ``metricsPort`` unset the daemon records into :class:`NullMetrics` and never loads it.

The endpoint is :mod:`multusd.daemon.metricsserver`'s.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence

from multusd import __version__
from multusd.core.records import count_stale_sandboxes

LOG = logging.getLogger(__name__)

__all__ = [
    "CONTENT_TYPE", "DURATION_BUCKETS", "DaemonMetrics", "NullMetrics", "TrackedRequest",
    "WithoutCreated", "count_scratch_entries", "handler_label",
]

#: What /metrics answers a scraper that does not ask for OpenMetrics (text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# CNI latencies: a loopback ADD takes a few ms, a bridge+IPAM ADD tens of ms, a slow IPAM or
# device plugin seconds; the request deadline is 110 s, so 120 s is the last finite bucket.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
                    30.0, 60.0, 120.0)

_CNI_HANDLERS = ("/cni", "/delegate", "/forget")  # counted by track_request
_KNOWN_HANDLERS = _CNI_HANDLERS + ("/healthz", "/readyz", "/status")
_HTTP_METHODS = {"get", "head", "post", "put", "delete", "patch", "options", "connect", "trace"}
# (name, help, kind) of the series read from a function at every scrape.
_SAMPLED = (
    ("multusd_cached_pods", "Pods of this node in the watch cache.", "gauge"),
    ("multusd_cached_nads", "NetworkAttachmentDefinitions in the watch cache.", "gauge"),
    ("multusd_scratch_cache_entries", "Sandboxes recorded in the scratch cache (cniDir).",
     "gauge"),
    ("multusd_stale_sandboxes", "Sandboxes whose network namespace is gone (multusd gc).",
     "gauge"),
    ("multusd_unreleased_sandboxes", "Sandboxes whose DEL kept failing past deleteRetryWindow: "
     "answered success, their records kept for multusd gc (multusd status lists them).",
     "gauge"),
    ("multusd_pod_cache_misses_total",
     "Pod lookups the watch cache could not answer (one live GET each).", "counter"),
    ("multusd_node_name_mismatch", "1 when this node's pods are scheduled on another node name "
     "than the one watched (the log names both); set nodeName.", "gauge"),
    ("multusd_watch_relists_total",
     "Watches that expired (410 Gone, lost history) and were listed again.", "counter"),
    ("multusd_nad_api_unavailable", "1 while the NetworkAttachmentDefinition watch fails (CRD "
     "not installed, forbidden, or not answering: multusd status says which).", "gauge"),
    ("multusd_nad_refusals_total", "ADDs refused because the NetworkAttachmentDefinition API "
     "is not installed or not readable with the node's credentials.", "counter"),
    ("multusd_credential_rotations_total",
     "Rotated credentials found and used (token file, client certificate, plugin).", "counter"),
)

# (name, help, kind, labels) of the series read from a function returning {labels: value}
# (a label value alone for a series of one label).
_SAMPLED_LABELLED = (
    ("multusd_kube_request_retries_total", "Requests to the API server sent again after a "
     "transient failure, by cause (429, 5xx, refused, reset, closed, tls-eof, proxy).",
     "counter", ("cause",)),
    ("multusd_watch_reopens_total",
     "Watches of the API server that ended and were opened again, by resource and cause "
     "(ended: by the server at its timeout; expired: 410 or lost history, then a relist; "
     "error: an ERROR event or an error answer; connection: the connection failed or was "
     "cut; silence: nothing arrived within the silence bound).", "counter",
     ("resource", "cause")),
    ("multusd_dynamic_reconciliations_total", "Running pods' changed network selections "
     "applied (enableDynamicNetworks), by outcome (changed: interfaces added or removed; "
     "unchanged: nothing to do or network-status only; refused: a selection that cannot be "
     "applied, said in a Warning event; failed: retried with backoff; gone: the sandbox was "
     "released meanwhile; stopped: the daemon stopped or the pod terminated).", "counter",
     ("outcome",)),
)
# series that exist only while a source is set (an opt-in feature's): none without it
_OPTIONAL = frozenset(("multusd_dynamic_reconciliations_total",))


def count_scratch_entries(cni_dir: str) -> Optional[int]:
    """Regular files directly in ``cni_dir`` (one per sandbox); 0 if it does not exist yet.

    Subdirectories (libcni's ``results/``) are not sandboxes and are not counted.
    None when the directory cannot be read, so the sample is left out rather than wrong.
    """
    try:
        with os.scandir(cni_dir) as entries:
            return sum(1 for entry in entries if entry.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return 0
    except OSError as exc:
        LOG.debug("cannot count the scratch cache entries in %s: %s", cni_dir, exc)
        return None


def _in_every(count: Callable[[str], Optional[int]],
              cni_dirs: Callable[[], Sequence[str]]) -> Callable[[], Optional[int]]:
    """``count`` summed over every cniDir the node names now (each once); None when one
    cannot be read (the sample is left out rather than wrong)."""
    def total() -> Optional[int]:
        counts = [count(d) for d in dict.fromkeys(os.path.realpath(d) for d in cni_dirs())]
        return None if any(c is None for c in counts) else sum(counts)
    return total


def _unreleased_counter(cni_dirs: Callable[[], Sequence[str]],
                        spare: str) -> Callable[[], Optional[int]]:
    from multusd.core.unreleased import count_unreleased  # only when metrics are on

    return lambda: count_unreleased(cni_dirs(), spare=spare)


def handler_label(path: str) -> str:
    """Upstream's handler label for a request path: the endpoint, or ``NotFound``."""
    path = path.split("?", 1)[0]
    return path if path in _KNOWN_HANDLERS else "NotFound"


class TrackedRequest:
    """What ``track_request`` records; set ``command`` once it is known.

    Also its own (empty) context manager: that is all :meth:`NullMetrics.track_request` costs.
    """

    __slots__ = ("handler", "command", "ok")

    def __init__(self, handler: str) -> None:
        self.handler = handler
        self.command = ""
        self.ok: Optional[bool] = None  # None: decided by whether the block raised

    def __enter__(self) -> "TrackedRequest":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class NullMetrics:
    """The recorder when ``metricsPort`` is unset: every method returns at once, nothing is
    imported, and the engine is handed no observer at all."""

    enabled = False

    def observe_plugin(self, plugin_type: str, command: str, seconds: float,
                       outcome: str = "ok") -> None:
        return None

    def observe_request(self, handler: str, command: str, ok: bool,
                        seconds: Optional[float] = None) -> None:
        return None

    def observe_http(self, path: str, method: str, status: int) -> None:
        return None

    def track_request(self, handler: str) -> TrackedRequest:
        return TrackedRequest(handler)

    def set_sources(self, **_sources: object) -> None:
        return None


class _Sampled:
    """A collector of unlabelled gauges and counters read from functions at every scrape.

    A series whose function is unset, returns None or raises is written without a sample:
    a scrape never fails because a source is broken.
    """

    def __init__(self, families: Mapping[str, Callable[[str, str], Any]]) -> None:
        self._families = families  # kind -> prometheus_client's Gauge/CounterMetricFamily
        self._functions: Dict[str, Optional[Callable[[], Any]]] = {
            name: None for name, _, _ in _SAMPLED}
        self._functions.update({entry[0]: None for entry in _SAMPLED_LABELLED})

    def set_function(self, name: str, function: Optional[Callable[[], Any]]) -> None:
        self._functions[name] = function

    def value(self, name: str) -> Optional[float]:
        function = self._functions[name]
        if function is None:
            return None
        try:
            value = function()
        except Exception:
            LOG.debug("metric %s: the sampling function failed", name, exc_info=True)
            return None
        return None if value is None else float(value)

    def describe(self) -> list:
        return [self._families[kind](name, text) for name, text, kind in _SAMPLED] + \
            [self._families[kind](name, text, labels=labels)
             for name, text, kind, labels in _SAMPLED_LABELLED if self._shown(name)]

    def _shown(self, name: str) -> bool:
        return name not in _OPTIONAL or self._functions[name] is not None

    def collect(self) -> Iterator[Any]:
        for name, text, kind in _SAMPLED:
            family = self._families[kind](name, text)
            value = self.value(name)
            if value is not None:
                family.add_metric([], value)
            yield family
        for name, text, kind, labels in _SAMPLED_LABELLED:
            if not self._shown(name):
                continue
            family = self._families[kind](name, text, labels=labels)
            samples = self._sample(name)
            for label_values, sample in sorted((samples or {}).items()):
                family.add_metric(list(label_values) if isinstance(label_values, tuple)
                                  else [str(label_values)], float(sample))
            yield family

    def _sample(self, name: str) -> Any:
        function = self._functions[name]
        try:
            return None if function is None else function()
        except Exception:
            LOG.debug("metric %s: the sampling function failed", name, exc_info=True)
            return None


class DaemonMetrics:
    """multusd's series (the module docstring lists them) on a registry of its own."""

    enabled = True

    def __init__(self, *, version: str = __version__) -> None:
        import prometheus_client as prom
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.registry = prom.CollectorRegistry()
        registry = self.registry
        self.requests = prom.Counter(
            "multusd_requests_total", "Requests answered, by endpoint, CNI command and outcome.",
            ("handler", "command", "result"), registry=registry)
        self.upstream_requests = prom.Counter(
            "multus_server_request_total", "Counter of HTTP requests (upstream Multus's series).",
            ("handler", "code", "method"), registry=registry)
        self.request_duration = prom.Histogram(
            "multusd_request_duration_seconds",
            "Time spent on a /cni or /delegate request, by CNI command.", ("command",),
            buckets=DURATION_BUCKETS, registry=registry)
        self.delegate_duration = prom.Histogram(
            "multusd_delegate_duration_seconds",
            "Time one delegate plugin execution took, by plugin type and CNI command.",
            ("plugin", "command"), buckets=DURATION_BUCKETS, registry=registry)
        self.in_flight = prom.Gauge(
            "multusd_requests_in_flight", "CNI requests being processed now.", registry=registry)
        self.sampled = _Sampled({"gauge": GaugeMetricFamily, "counter": CounterMetricFamily})
        registry.register(self.sampled)
        self.build_info = prom.Gauge(
            "multusd_build_info", "Always 1; the version label says which multusd runs.",
            ("version",), registry=registry)
        self.build_info.labels(version=version).set(1)
        self._generate = prom.generate_latest

    def render(self) -> str:
        """The exposition text /metrics serves (format 0.0.4)."""
        return self._generate(WithoutCreated(self.registry)).decode("utf-8")

    def set_sources(self, *, cached_pods: Optional[Callable[[], Optional[float]]] = None,
                    cached_nads: Optional[Callable[[], Optional[float]]] = None,
                    cni_dirs: Optional[Callable[[], Sequence[str]]] = None,
                    marks_spare: str = "",
                    pod_cache_misses: Optional[Callable[[], Optional[float]]] = None,
                    node_name_mismatch: Optional[Callable[[], Optional[float]]] = None,
                    watch_relists: Optional[Callable[[], Optional[float]]] = None,
                    watch_reopens: Optional[Callable[[], Optional[Mapping]]] = None,
                    **kube: Optional[Callable[[], Optional[float]]]) -> None:
        """Where the sampled gauges read from; an argument left None keeps that gauge empty.
        ``cni_dirs``: every cniDir the node names, as it resolves at each scrape (the
        sandboxes' gauges count them all); ``marks_spare``: the marks of failed DELs that a
        cniDir could not take.

        ``kube`` may name ``nad_api_unavailable``, ``nad_refusals``, ``credential_rotations``,
        ``kube_request_retries`` (a dict by cause) and ``dynamic_reconciliations`` (a dict by
        outcome) (the series of the same name, ``_total`` for counters); ``watch_reopens``
        returns {(resource, cause): count}.
        """
        for key, function in kube.items():
            name = f"multusd_{key}" + ("" if key == "nad_api_unavailable" else "_total")
            if name not in self.sampled._functions:
                raise TypeError(f"no sampled series {name}")
            self.sampled.set_function(name, function)
        self.sampled.set_function("multusd_cached_pods", cached_pods)
        self.sampled.set_function("multusd_cached_nads", cached_nads)
        self.sampled.set_function("multusd_pod_cache_misses_total", pod_cache_misses)
        self.sampled.set_function("multusd_node_name_mismatch", node_name_mismatch)
        self.sampled.set_function("multusd_watch_relists_total", watch_relists)
        self.sampled.set_function("multusd_watch_reopens_total", watch_reopens)
        self.sampled.set_function(
            "multusd_scratch_cache_entries",
            None if cni_dirs is None else _in_every(count_scratch_entries, cni_dirs))
        self.sampled.set_function(
            "multusd_stale_sandboxes",
            None if cni_dirs is None else _in_every(count_stale_sandboxes, cni_dirs))
        self.sampled.set_function("multusd_unreleased_sandboxes",
                                  None if cni_dirs is None
                                  else _unreleased_counter(cni_dirs, marks_spare))

    def observe_plugin(self, plugin_type: str, command: str, seconds: float,
                       outcome: str = "ok") -> None:
        """The engine's observer: one plugin execution took ``seconds`` (whatever ``outcome``)."""
        self.delegate_duration.labels(plugin_type, command).observe(seconds)

    def observe_request(self, handler: str, command: str, ok: bool,
                        seconds: Optional[float] = None) -> None:
        """One request finished: count it, and time it when ``seconds`` is given."""
        self.requests.labels(handler, command, "ok" if ok else "error").inc()
        if seconds is not None:
            self.request_duration.labels(command).observe(seconds)

    def observe_http(self, path: str, method: str, status: int) -> None:
        """One HTTP answer on the API socket, in upstream's series.

        For the endpoints that are not CNI requests (/healthz, /readyz, anything else as
        ``NotFound``) this also counts ``multusd_requests_total`` with an empty command,
        result ok below 400; /cni, /delegate and /forget are counted there by :meth:`track_request`.
        """
        handler = handler_label(path)
        method = method.lower()
        self.upstream_requests.labels(handler, str(status),
                                      method if method in _HTTP_METHODS else "unknown").inc()
        if handler not in _CNI_HANDLERS:
            self.requests.labels(handler, "", "ok" if status < 400 else "error").inc()

    @contextlib.contextmanager
    def track_request(self, handler: str) -> Iterator[TrackedRequest]:
        """Time a /cni or /delegate request and keep it in the in-flight gauge meanwhile.

        The result is ``error`` when the block raises (the exception propagates) unless the
        block set ``tracked.ok`` itself.
        """
        tracked = TrackedRequest(handler)
        started = time.monotonic()
        self.in_flight.inc()
        try:
            yield tracked
        except BaseException:
            if tracked.ok is None:
                tracked.ok = False
            raise
        finally:
            self.in_flight.dec()
            self.observe_request(handler, tracked.command,
                                 tracked.ok if tracked.ok is not None else True,
                                 time.monotonic() - started)


class WithoutCreated:
    """A registry as /metrics shows it: without the ``*_created`` samples prometheus_client
    adds to counters and histograms (0.16 turns them off only through the environment);
    upstream's Go client has none either."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Any]:
        for family in self._registry.collect():
            created = family.name + "_created"
            if any(sample.name == created for sample in family.samples):
                family = copy.copy(family)
                family.samples = [s for s in family.samples if s.name != created]
            yield family

    def restricted_registry(self, names: Any) -> "WithoutCreated":  # ?name[]=... scrapes
        return WithoutCreated(self._registry.restricted_registry(names))
