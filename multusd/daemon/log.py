"""Logging set-up and per-request context.

journald is the home of the logs: every request line carries structured fields
(CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID,
REQUEST_ID, and DURATION_MS on completion) so ``journalctl -u multusd K8S_POD_NAME=web-0``
finds one pod's story. Also to stderr unless ``logToStderr`` is false (and never twice when
stderr already is the journal), and to ``logFile`` with ``logOptions`` rotation when set.
Levels are upstream's: debug, verbose, error, panic.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, List, Mapping, MutableMapping

from multusd.daemon import systemd

LEVELS = {"debug": logging.DEBUG, "verbose": logging.INFO, "error": logging.ERROR,
          "panic": logging.CRITICAL}
FORMAT = "%(asctime)s [%(levelname)s] %(message)s"
_redactors: List[Callable[[str], str]] = []


class _Redacting(logging.Filter):
    """Cuts every known credential out of a record before any handler writes it: its message,
    and the traceback and stack it carries. The traceback is formatted here, once, and the
    exception dropped from the record, so that no handler formats it after this filter ran
    (the journal handler would also send the exception itself as a field)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _redactors:
            return True
        try:
            record.msg, record.args = _redacted(record.getMessage()), None
        except Exception:  # a malformed call: the handler reports it (logging.raiseExceptions)
            return True
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = _TRACEBACKS.formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = _redacted(record.exc_text)
        if record.stack_info:
            record.stack_info = _redacted(record.stack_info)
        return True


_TRACEBACKS = logging.Formatter()


def _redacted(text: str) -> str:
    for redact in list(_redactors):
        text = redact(text)
    return text


def redact_with(redact: Callable[[str], str]) -> Callable[[], None]:
    """Apply ``redact`` (the kube client's: every token it has seen, rotated ones too) to every
    log line from now on, whatever module wrote it; returns what undoes that."""
    _redactors.append(redact)
    return lambda: _redactors.remove(redact)


def setup(level: str = "verbose", log_file: str = "", log_options: Mapping[str, Any] | None = None,
          to_stderr: bool = True, journal: bool = True) -> None:
    """Install the handlers on the ``multusd`` logger (idempotent)."""
    root = logging.getLogger("multusd")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(LEVELS.get(level.lower(), logging.INFO))
    root.propagate = False
    handler = systemd.journal_handler() if journal else None
    if handler is not None:
        attach(handler)
    if to_stderr and not (handler is not None and systemd.stderr_is_journal()):
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(_ContextFormatter(FORMAT, "%Y-%m-%dT%H:%M:%S%z"))
        attach(stream)
    if log_file:
        attach(_file_handler(log_file, log_options or {}))


def attach(handler: logging.Handler) -> None:
    """Add ``handler`` to the ``multusd`` logger, behind the redaction every handler has."""
    handler.addFilter(_Redacting())
    logging.getLogger("multusd").addHandler(handler)


def _file_handler(path: str, options: Mapping[str, Any]) -> logging.Handler:
    """Upstream's lumberjack defaults (100 MB, 5 backups) through the standard rotating handler."""
    import logging.handlers  # logFile only: it imports socket, pickle and queue

    max_mb = int(options.get("maxSize") or 100)
    backups = int(options.get("maxBackups") or 5)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_mb * 1024 * 1024,
                                                   backupCount=backups)
    handler.setFormatter(_ContextFormatter(FORMAT, "%Y-%m-%dT%H:%M:%S%z"))
    return handler


UPSTREAM_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "verbose",
                        logging.WARNING: "warning", logging.ERROR: "error",
                        logging.CRITICAL: "panic"}


class _ContextFormatter(logging.Formatter):
    """Upstream's ``<time> [<level>] <msg>`` lines, plus the request's pod and container
    (the journal gets those as fields instead)."""

    def format(self, record: logging.LogRecord) -> str:
        line = logging.makeLogRecord(record.__dict__)
        line.levelname = UPSTREAM_LEVEL_NAMES.get(record.levelno, record.levelname.lower())
        text = super().format(line)
        pod = getattr(record, "K8S_POD_NAME", "")
        if pod:
            text += (f" pod={getattr(record, 'K8S_POD_NAMESPACE', '')}/{pod}"
                     f" container={getattr(record, 'CNI_CONTAINERID', '')[:12]}")
        return text


class RequestLogger(logging.LoggerAdapter):
    """A logger adapter that puts one request's identity on every line as journal fields."""

    def __init__(self, logger: logging.Logger, fields: Mapping[str, str]) -> None:
        super().__init__(logger, {k: v for k, v in fields.items() if v})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]):
        extra = dict(self.extra)
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


def request_fields(env: Mapping[str, str], k8s_args: Mapping[str, str], request_id: str) -> dict:
    """The structured fields of one request, from its CNI env and parsed CNI_ARGS."""
    fields = {key: env.get(key, "") for key in ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME")}
    for key in ("K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID"):
        fields[key] = k8s_args.get(key, "")
    fields["REQUEST_ID"] = request_id
    return fields
