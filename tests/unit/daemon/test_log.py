"""Logging: journal fields on every request line, levels, stderr suppression."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from multusd.daemon import log


@pytest.fixture(autouse=True)
def restore_multusd_logger():
    """log.setup() reconfigures the "multusd" logger; give later tests the one they had."""
    logger = logging.getLogger("multusd")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


class Capture(logging.Handler):
    """Keeps the records exactly as a JournalHandler would receive them."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_request_lines_carry_the_journal_fields():
    logger = logging.getLogger("multusd.test-fields")
    capture = Capture()
    logger.addHandler(capture)
    logger.setLevel(logging.DEBUG)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_IFNAME": "eth0"}
    k8s = {"K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "web-0", "K8S_POD_UID": "u-1"}
    adapter = log.RequestLogger(logger, log.request_fields(env, k8s, "req-1"))
    adapter.info("ADD finished", extra={"DURATION_MS": "12.5"})
    record = capture.records[0]
    for key, value in {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_IFNAME": "eth0",
                       "K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "web-0",
                       "K8S_POD_UID": "u-1", "REQUEST_ID": "req-1", "DURATION_MS": "12.5"}.items():
        assert getattr(record, key) == value, key
    logger.removeHandler(capture)


def test_levels_follow_upstream_names(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    log.setup("error", to_stderr=True, journal=False)
    logger = logging.getLogger("multusd.test-levels")
    logger.info("quiet")
    logger.error("loud")
    assert "loud" in stream.getvalue() and "quiet" not in stream.getvalue()
    log.setup("verbose", to_stderr=True, journal=False)
    logger.info("now visible")
    assert "now visible" in stream.getvalue()


def test_log_to_stderr_false_suppresses_stderr(monkeypatch, tmp_path):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    log_file = tmp_path / "multus.log"
    log.setup("verbose", log_file=str(log_file), to_stderr=False, journal=False)
    logging.getLogger("multusd.test-stderr").info("to the file only")
    assert stream.getvalue() == ""
    assert "[verbose] to the file only" in log_file.read_text()
    log.setup("verbose", to_stderr=False, journal=False)


def test_every_line_is_redacted_once_a_client_registers_its_secrets(capsys):
    from multusd.kube.credentials import Secrets

    secrets = Secrets()
    secrets.add("Bearer tok-rotated-7f3a9c")
    log.setup("verbose", to_stderr=True, journal=False)
    undo = log.redact_with(secrets.redact)
    try:
        logging.getLogger("multusd.kube.somewhere").warning("the API said %s",
                                                            "tok-rotated-7f3a9c")
    finally:
        undo()
    err = capsys.readouterr().err
    assert "the API said <redacted>" in err and "tok-rotated" not in err


TOKEN = "tok-in-an-exception-5e1d"


def test_a_traceback_carrying_a_credential_is_redacted_in_every_handler(capsys, tmp_path):
    """The stderr, file and journal handlers all format the exception after the filter ran."""
    from systemd.journal import JournalHandler

    from multusd.kube.credentials import Secrets

    sent: list = []

    def journal_send(text, /, **fields):  # what systemd.journal.send would send
        sent.append(dict(fields, MESSAGE=text))

    secrets = Secrets()
    secrets.add(f"Bearer {TOKEN}")
    log_file = tmp_path / "multus.log"
    log.setup("verbose", log_file=str(log_file), to_stderr=True, journal=False)
    log.attach(JournalHandler(sender_function=journal_send, SYSLOG_IDENTIFIER="multusd"))
    logger = logging.getLogger("multusd.kube.somewhere")
    undo = log.redact_with(secrets.redact)
    try:
        try:
            raise RuntimeError(f"the API server refused Authorization: Bearer {TOKEN}")
        except RuntimeError:
            logger.exception("the watch failed")
        logger.warning("a stack follows", stack_info=True)  # shown: tok-in-an-exception-5e1d
    finally:
        undo()
    err, written = capsys.readouterr().err, log_file.read_text()
    for text in (err, written):
        assert "the watch failed\nTraceback (most recent call last):" in text
        assert "RuntimeError: the API server refused Authorization: <redacted>" in text
        assert "a stack follows\nStack (most recent call last):" in text
        assert TOKEN not in text
    assert [entry["MESSAGE"].splitlines()[0] for entry in sent] == ["the watch failed",
                                                                     "a stack follows"]
    assert "Authorization: <redacted>" in sent[0]["MESSAGE"]
    assert "Authorization: <redacted>" in sent[0]["EXCEPTION_TEXT"]
    leaked = [(key, value) for entry in sent for key, value in entry.items()
              if TOKEN in str(value)]
    assert leaked == []
