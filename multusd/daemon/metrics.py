"""Prometheus metrics of multusd: a small thread-safe registry, the daemon's series, /metrics.

Standard library only: a handful of series does not justify a client library. The text is
Prometheus exposition format 0.0.4 (``# HELP``/``# TYPE`` lines, escaped label values,
cumulative ``_bucket{le=...}`` lines ending with ``+Inf``, then ``_sum`` and ``_count``).

Series (see :class:`DaemonMetrics`)::

    multusd_requests_total{handler,command,result}   counter, result ok|error
    multus_server_request_total{handler,code,method} counter, upstream's name and labels
    multusd_request_duration_seconds{command}        histogram
    multusd_delegate_duration_seconds{plugin,command} histogram, one per plugin exec
    multusd_requests_in_flight                       gauge
    multusd_cached_pods / multusd_cached_nads        gauges, read from the watch caches
    multusd_scratch_cache_entries                    gauge, files in cniDir
    multusd_pod_cache_misses_total / multusd_watch_relists_total  counters, from the caches
    multusd_node_name_mismatch                       gauge, 1 when the watched name is wrong
    multusd_build_info{version}                      always 1

Usage from the daemon::

    server = metrics.serve(config.metrics_address, config.metrics_port)  # enables DEFAULT
    with metrics.track_request("/cni") as tracked:
        tracked.command = "ADD"
        ...
    metrics.observe_plugin("bridge", "ADD", 0.012)  # from the engine, after each exec
    server.close()

The module-level functions record into :data:`DEFAULT`, which ignores every call (a flag
test, nothing else) until :func:`serve` starts, so the engine may call them unconditionally.

Upstream binds its metrics port on every interface without authentication; multusd binds
127.0.0.1 unless ``metricsAddress`` in daemon-config.json says otherwise.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import math
import os
import re
import selectors
import socket
import threading
import time
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple

from multusd import __version__

LOG = logging.getLogger(__name__)

__all__ = [
    "CONTENT_TYPE", "DEFAULT", "DEFAULT_ADDRESS", "DURATION_BUCKETS", "Counter",
    "DaemonMetrics", "Gauge", "Histogram", "MetricsServer", "MetricsServerError", "Registry",
    "Sampled", "count_scratch_entries", "observe_http", "observe_plugin", "serve",
    "track_request",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_ADDRESS = "127.0.0.1"
# CNI latencies: a loopback ADD takes a few ms, a bridge+IPAM ADD tens of ms, a slow IPAM or
# device plugin seconds; the request deadline is 110 s, so 120 s is the last finite bucket.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
                    30.0, 60.0, 120.0)

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_CNI_HANDLERS = ("/cni", "/delegate")
_KNOWN_HANDLERS = _CNI_HANDLERS + ("/healthz", "/readyz")
_HTTP_METHODS = {"get", "head", "post", "put", "delete", "patch", "options", "connect", "trace"}

LabelValues = Tuple[str, ...]


# -- text format helpers ----------------------------------------------------------------------

def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: ``+Inf``, ``NaN``, ``3``, ``0.25``, ``1e+16``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def escape_label_value(value: str) -> str:
    """Backslash, double quote and newline escaped, as format 0.0.4 requires in label values."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """Backslash and newline escaped (HELP text keeps double quotes as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{name}="{escape_label_value(value)}"' for name, value in zip(names, values))
    return "{" + pairs + "}"


# -- metrics ----------------------------------------------------------------------------------

class _Metric:
    """A metric family: name, help, label names; subclasses hold the samples."""

    kind = "untyped"
    _reserved_labels: Tuple[str, ...] = ()

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:  # noqa: A002
        if not _METRIC_NAME.match(name):
            raise ValueError(f"metric name {name!r} is not valid; use letters, digits, '_' "
                             "and ':' only, not starting with a digit")
        for label in labelnames:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"label name {label!r} of {name!r} is not valid; use letters, "
                                 "digits and '_', not starting with a digit or '__'")
            if label in self._reserved_labels:
                raise ValueError(f"label name {label!r} is reserved in a {self.kind} "
                                 f"({name!r}); choose another name")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"metric {name!r} lists a label name twice: {list(labelnames)!r}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Dict[str, object]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"metric {self.name!r} takes the labels {list(self.labelnames)!r}, "
                             f"got {sorted(labels)!r}")
        return tuple(str(labels[name]) for name in self.labelnames)

    def header(self) -> List[str]:
        return [f"# HELP {self.name} {escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> List[str]:
        raise NotImplementedError

    def render(self) -> str:
        """The family's lines, each ending in a newline."""
        return "".join(line + "\n" for line in self.header() + self.samples())


class _ValueMetric(_Metric):
    """One float per label set; the unlabelled series exists (at 0) from the start."""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:  # noqa: A002
        super().__init__(name, help, labelnames)
        self._values: Dict[LabelValues, float] = {} if labelnames else {(): 0.0}

    def get(self, **labels: object) -> float:
        """The current value of one series (0 if it was never touched)."""
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def _add(self, amount: float, labels: Dict[str, object]) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def samples(self) -> List[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_label_text(self.labelnames, key)} {format_value(value)}"
                for key, value in items]


class Counter(_ValueMetric):
    """A value that only goes up (requests served, errors)."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        """Add ``amount`` (≥ 0) to the series named by ``labels``.

        :raises ValueError: a negative amount, or labels other than the declared ones.
        """
        if amount < 0:
            raise ValueError(f"counter {self.name!r} cannot go down (inc by {amount!r}); "
                             "use a Gauge for values that fall")
        self._add(amount, labels)


class Gauge(_ValueMetric):
    """A value that goes up and down (requests in flight)."""

    kind = "gauge"

    def set(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, **labels: object) -> None:
        self._add(-amount, labels)


class Sampled(_Metric):
    """One unlabelled value read from ``function`` at every scrape (cache sizes, file counts).

    ``function`` may be set later with :meth:`set_function`. While it is unset, returns None
    or raises, the family is written without a sample: a scrape never fails because of it.
    """

    def __init__(self, name: str, help: str,  # noqa: A002
                 function: Optional[Callable[[], Optional[float]]] = None,
                 kind: str = "gauge") -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"a sampled metric is a 'gauge' or a 'counter', not {kind!r}")
        self.kind = kind
        super().__init__(name, help)
        self._function = function

    def set_function(self, function: Optional[Callable[[], Optional[float]]]) -> None:
        self._function = function

    def value(self) -> Optional[float]:
        """What the function says now; None when it is unset or fails."""
        function = self._function
        if function is None:
            return None
        try:
            value = function()
        except Exception:  # a broken source must not break the whole scrape
            LOG.debug("metric %s: the sampling function failed", self.name, exc_info=True)
            return None
        return None if value is None else float(value)

    def samples(self) -> List[str]:
        value = self.value()
        return [] if value is None else [f"{self.name} {format_value(value)}"]


class Histogram(_Metric):
    """Observations counted into fixed buckets (upper bounds, inclusive), with sum and count."""

    kind = "histogram"
    _reserved_labels = ("le",)

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (),  # noqa: A002
                 buckets: Sequence[float] = DURATION_BUCKETS) -> None:
        super().__init__(name, help, labelnames)
        bounds = [float(bound) for bound in buckets if not math.isinf(bound)]
        if not bounds or bounds != sorted(set(bounds)):
            raise ValueError(f"buckets of {name!r} must be finite, increasing and not empty; "
                             f"got {list(buckets)!r}")
        self.bounds = tuple(bounds)
        # per label set: [count in each finite bucket (not cumulative), count above all], sum
        self._series: Dict[LabelValues, Tuple[List[int], List[float]]] = {}
        if not labelnames:
            self._series[()] = self._empty()

    def _empty(self) -> Tuple[List[int], List[float]]:
        return [0] * (len(self.bounds) + 1), [0.0]

    def observe(self, value: float, **labels: object) -> None:
        """Count ``value`` in the first bucket whose bound is ≥ it, and in sum and count.

        :raises ValueError: a NaN value, or labels other than the declared ones.
        """
        if math.isnan(value):
            raise ValueError(f"histogram {self.name!r} cannot observe NaN")
        key = self._key(labels)
        index = bisect.bisect_left(self.bounds, value)  # bound == value belongs to that bucket
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = self._empty()
            series[0][index] += 1
            series[1][0] += value

    def snapshot(self, **labels: object) -> Tuple[List[int], float, int]:
        """(cumulative counts per bound incl. +Inf, sum, count) of one series, for tests."""
        key = self._key(labels)
        with self._lock:
            counts, total = self._series.get(key, self._empty())
            counts = list(counts)
            total_sum = total[0]
        cumulative = _cumulative(counts)
        return cumulative, total_sum, cumulative[-1]

    def samples(self) -> List[str]:
        with self._lock:  # one consistent copy: +Inf bucket always equals _count
            items = sorted((key, list(counts), total[0])
                           for key, (counts, total) in self._series.items())
        names = self.labelnames + ("le",)
        lines: List[str] = []
        bound_texts = [format_value(bound) for bound in self.bounds] + ["+Inf"]
        for key, counts, total_sum in items:
            cumulative = _cumulative(counts)
            for bound_text, count in zip(bound_texts, cumulative):
                labels = _label_text(names, key + (bound_text,))
                lines.append(f"{self.name}_bucket{labels} {count}")
            plain = _label_text(self.labelnames, key)
            lines.append(f"{self.name}_sum{plain} {format_value(total_sum)}")
            lines.append(f"{self.name}_count{plain} {cumulative[-1]}")
        return lines


def _cumulative(counts: Sequence[int]) -> List[int]:
    out: List[int] = []
    running = 0
    for count in counts:
        running += count
        out.append(running)
    return out


class Registry:
    """The metric families one /metrics endpoint exposes, in registration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: Dict[str, _Metric] = {}

    def register(self, metric: _Metric) -> _Metric:
        """Add ``metric``; returns it. :raises ValueError: the name is already registered."""
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"a metric named {metric.name!r} is already registered")
            self._metrics[metric.name] = metric
        return metric

    def get(self, name: str) -> Optional[_Metric]:
        with self._lock:
            return self._metrics.get(name)

    def render(self) -> str:
        """The whole exposition text (format 0.0.4)."""
        with self._lock:
            metrics = list(self._metrics.values())
        return "".join(metric.render() for metric in metrics)


# -- the daemon's series ----------------------------------------------------------------------

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


class TrackedRequest:
    """What :meth:`DaemonMetrics.track_request` records; set ``command`` once it is known."""

    __slots__ = ("handler", "command", "ok")

    def __init__(self, handler: str) -> None:
        self.handler = handler
        self.command = ""
        self.ok: Optional[bool] = None  # None: decided by whether the block raised


class DaemonMetrics:
    """multusd's series on one :class:`Registry` (the module docstring lists them).

    While ``enabled`` is false every recording method returns at once, so call sites need
    no checks of their own.
    """

    def __init__(self, registry: Optional[Registry] = None, *, enabled: bool = True,
                 version: str = __version__) -> None:
        self.registry = registry if registry is not None else Registry()
        self.enabled = enabled
        add = self.registry.register
        self.requests = add(Counter(
            "multusd_requests_total", "Requests answered, by endpoint, CNI command and outcome.",
            ("handler", "command", "result")))
        self.upstream_requests = add(Counter(
            "multus_server_request_total", "Counter of HTTP requests (upstream Multus's series).",
            ("handler", "code", "method")))
        self.request_duration = add(Histogram(
            "multusd_request_duration_seconds",
            "Time spent on a /cni or /delegate request, by CNI command.", ("command",)))
        self.delegate_duration = add(Histogram(
            "multusd_delegate_duration_seconds",
            "Time one delegate plugin execution took, by plugin type and CNI command.",
            ("plugin", "command")))
        self.in_flight = add(Gauge(
            "multusd_requests_in_flight", "CNI requests being processed now."))
        self.cached_pods = add(Sampled(
            "multusd_cached_pods", "Pods of this node in the watch cache."))
        self.cached_nads = add(Sampled(
            "multusd_cached_nads", "NetworkAttachmentDefinitions in the watch cache."))
        self.scratch_entries = add(Sampled(
            "multusd_scratch_cache_entries", "Sandboxes recorded in the scratch cache (cniDir)."))
        self.pod_cache_misses = add(Sampled(
            "multusd_pod_cache_misses_total",
            "Pod lookups the watch cache could not answer (one live GET each).", kind="counter"))
        self.node_name_mismatch = add(Sampled(
            "multusd_node_name_mismatch", "1 when this node's pods are scheduled on another "
            "node name than the one watched (the log names both); set nodeName."))
        self.watch_relists = add(Sampled(
            "multusd_watch_relists_total",
            "Watches that expired (410 Gone, lost history) and were listed again.",
            kind="counter"))
        self.build_info = add(Gauge(
            "multusd_build_info", "Always 1; the version label says which multusd runs.",
            ("version",)))
        self.build_info.set(1, version=version)

    def enable(self) -> None:
        self.enabled = True

    def set_sources(self, *, cached_pods: Optional[Callable[[], Optional[float]]] = None,
                    cached_nads: Optional[Callable[[], Optional[float]]] = None,
                    cni_dir: Optional[str] = None,
                    pod_cache_misses: Optional[Callable[[], Optional[float]]] = None,
                    node_name_mismatch: Optional[Callable[[], Optional[float]]] = None,
                    watch_relists: Optional[Callable[[], Optional[float]]] = None) -> None:
        """Where the sampled gauges read from; an argument left None keeps that gauge empty."""
        self.cached_pods.set_function(cached_pods)
        self.cached_nads.set_function(cached_nads)
        self.pod_cache_misses.set_function(pod_cache_misses)
        self.node_name_mismatch.set_function(node_name_mismatch)
        self.watch_relists.set_function(watch_relists)
        self.scratch_entries.set_function(
            None if cni_dir is None else (lambda: count_scratch_entries(cni_dir)))

    def observe_plugin(self, plugin_type: str, command: str, seconds: float) -> None:
        """One delegate plugin execution took ``seconds`` (successful or not)."""
        if self.enabled:
            self.delegate_duration.observe(seconds, plugin=plugin_type, command=command)

    def observe_request(self, handler: str, command: str, ok: bool,
                        seconds: Optional[float] = None) -> None:
        """One request finished: count it, and time it when ``seconds`` is given."""
        if not self.enabled:
            return
        self.requests.inc(handler=handler, command=command, result="ok" if ok else "error")
        if seconds is not None:
            self.request_duration.observe(seconds, command=command)

    def observe_http(self, path: str, method: str, status: int) -> None:
        """One HTTP answer on the API socket, in upstream's series.

        For the endpoints that are not CNI requests (/healthz, /readyz, anything else as
        ``NotFound``) this also counts ``multusd_requests_total`` with an empty command,
        result ok below 400; /cni and /delegate are counted there by :meth:`track_request`.
        """
        if not self.enabled:
            return
        handler = handler_label(path)
        method = method.lower()
        self.upstream_requests.inc(handler=handler, code=str(status),
                                   method=method if method in _HTTP_METHODS else "unknown")
        if handler not in _CNI_HANDLERS:
            self.requests.inc(handler=handler, command="", result="ok" if status < 400 else "error")

    @contextlib.contextmanager
    def track_request(self, handler: str) -> Iterator[TrackedRequest]:
        """Time a /cni or /delegate request and keep it in the in-flight gauge meanwhile.

        The result is ``error`` when the block raises (the exception propagates) unless the
        block set ``tracked.ok`` itself.
        """
        tracked = TrackedRequest(handler)
        if not self.enabled:
            yield tracked
            return
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


def handler_label(path: str) -> str:
    """Upstream's handler label for a request path: the endpoint, or ``NotFound``."""
    path = path.split("?", 1)[0]
    return path if path in _KNOWN_HANDLERS else "NotFound"


DEFAULT = DaemonMetrics(enabled=False)


def observe_plugin(plugin_type: str, command: str, seconds: float) -> None:
    """Record one delegate plugin execution in :data:`DEFAULT` (no-op until :func:`serve`)."""
    DEFAULT.observe_plugin(plugin_type, command, seconds)


def observe_http(path: str, method: str, status: int) -> None:
    """Record one HTTP answer on the API socket in :data:`DEFAULT`."""
    DEFAULT.observe_http(path, method, status)


def track_request(handler: str) -> ContextManager[TrackedRequest]:
    """:meth:`DaemonMetrics.track_request` on :data:`DEFAULT`."""
    return DEFAULT.track_request(handler)


# -- the HTTP endpoint ------------------------------------------------------------------------

class MetricsServerError(Exception):
    """The metrics endpoint cannot listen; the message names the key to change."""


def _make_http_server(address: Tuple[str, int], registry: Registry) -> Any:
    """A bound ThreadingHTTPServer answering GET /metrics from ``registry``.

    http.server is imported here, not at module level: it pulls in the email package, and
    the engine imports this module only to call :func:`observe_plugin`.
    """
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class MetricsHandler(BaseHTTPRequestHandler):
        server_version = "multusd"
        sys_version = ""
        timeout = 10.0  # a scraper that stalls mid-request must not hold a thread for ever

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib
            LOG.debug("metrics http: " + format, *args)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                return self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
            try:
                body = registry.render().encode("utf-8")
            except Exception:
                LOG.exception("rendering the metrics failed")
                return self._send(500, b"rendering the metrics failed; see the multusd log\n",
                                  "text/plain; charset=utf-8")
            self._send(200, body, CONTENT_TYPE)

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class MetricsHTTPServer(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET

    return MetricsHTTPServer(address, MetricsHandler)


class MetricsServer:
    """GET /metrics served on a daemon thread; :meth:`close` stops it and frees the port.

    The accept loop waits on the listening socket and a wake-up pipe, so closing is
    immediate and an idle daemon never wakes up to poll.
    """

    def __init__(self, httpd: Any) -> None:
        self._httpd = httpd
        self.address: str = httpd.server_address[0]
        self.port: int = httpd.server_address[1]
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="multusd-metrics",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        # a selector, not select.select(): that one fails on descriptors above 1023
        with selectors.DefaultSelector() as selector:
            selector.register(self._httpd.fileno(), selectors.EVENT_READ, "listener")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while True:
                events = selector.select()
                if any(key.data == "wake" for key, _ in events):
                    return
                self._httpd.handle_request()  # accepts one connection; a thread answers it

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._httpd.server_close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(address: str = DEFAULT_ADDRESS, port: int = 0, *,
          registry: Optional[Registry] = None) -> MetricsServer:
    """Serve ``registry`` (default: :data:`DEFAULT`'s, which this enables) at /metrics.

    :param address: where to listen; "" means 127.0.0.1. "0.0.0.0" or "::" expose the
        endpoint to the network, unauthenticated, as upstream always does.
    :param port: the TCP port (``metricsPort``); 0 picks a free one, see ``.port``.
    :returns: a running :class:`MetricsServer`.
    :raises MetricsServerError: the port is taken or the address is not on this host.
    """
    address = address or DEFAULT_ADDRESS
    try:
        httpd = _make_http_server(
            (address, port), registry if registry is not None else DEFAULT.registry)
    except OSError as exc:
        raise MetricsServerError(_bind_failure(address, port, exc)) from exc
    if registry is None:
        DEFAULT.enable()
    server = MetricsServer(httpd)
    LOG.info("serving metrics on %s", server.url)
    return server


def _bind_failure(address: str, port: int, exc: OSError) -> str:
    where = f"{address}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot serve metrics on {where}: port {port} is already in use by another "
                f"process; set \"metricsPort\" in daemon-config.json to a free port, or remove "
                f"it to turn the metrics endpoint off")
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(exc, socket.gaierror):
        return (f"cannot serve metrics on {where}: {address!r} is not an address of this host "
                f"({exc.strerror or exc}); fix \"metricsAddress\" in daemon-config.json "
                f"(default {DEFAULT_ADDRESS})")
    return (f"cannot serve metrics on {where}: {exc.strerror or exc}; check \"metricsAddress\" "
            f"and \"metricsPort\" in daemon-config.json")
