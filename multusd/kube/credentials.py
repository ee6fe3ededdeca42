"""The credentials of one kubeconfig, re-read when they rotate: token file, client certificate, plugins.

Credentials on a node rotate under a running daemon: a projected service-account token (a
``tokenFile``) is replaced every hour, the kubelet replaces ``kubelet-client-current.pem`` (a
symlink) before its certificate expires, an ``exec`` plugin's token expires. As client-go
does, :class:`Credentials` notices it instead of failing every request until a restart:

* a ``tokenFile`` is looked at (``stat``) before every request and re-read when it changed, and
  at least every :data:`TOKEN_REREAD` seconds whatever ``stat`` says;
* the client certificate and key files are looked at too: when either changed (another
  file behind the symlink), :attr:`Credentials.tls_generation` goes up and the transport
  opens new connections with the new pair;
* a credential plugin's token is the ``kubernetes`` package's: its Configuration's
  ``refresh_api_key_hook`` runs the plugin again once the token expired; after a 401 the
  package's loader is run again (at most every :data:`PLUGIN_RELOAD_PAUSE` seconds).

After a 401, :meth:`Credentials.refresh` re-reads everything at once, so that a rotation
between two looks costs one retried request. The live credentials are kept in
:class:`Secrets`, which redacts them from every message: the current ones and, for messages
about requests sent with it, the one each just replaced; older ones are forgotten, so that
neither memory nor the cost of redacting a log line grows with the daemon's uptime (a
projected token rotates every hour).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from multusd.kube import kubeconfig

LOG = logging.getLogger(__name__)

TOKEN_REREAD = 60.0  # client-go re-reads a token file every minute
PLUGIN_RELOAD_PAUSE = 5.0
REDACTED = "<redacted>"
AUTHORIZATION = "authorization"  # the Secrets slot of the Authorization header

FileId = Optional[Tuple[int, int, int, int]]


class Secrets:
    """The live credential values, to be cut out of any text (thread-safe).

    Each slot (the Authorization header, a password) holds its current value and the one
    that value replaced: at most two values per slot, whatever the uptime.
    """

    def __init__(self) -> None:
        self._slots: Dict[str, Tuple[str, ...]] = {}
        self._values: Tuple[str, ...] = ()  # longest first, what redact() cuts out
        self._lock = threading.Lock()

    def add(self, header_or_token: Optional[str], slot: str = "") -> None:
        """``header_or_token`` is now the value of ``slot``; the one it replaces is kept until
        the next replacement."""
        if not header_or_token:
            return
        with self._lock:
            held = self._slots.get(slot, ())
            if held[:1] == (header_or_token,):
                return
            self._slots[slot] = (header_or_token,) + held[:1]
            values = set()
            for value in (v for kept in self._slots.values() for v in kept):
                values.add(value)
                values.add(value.split(" ", 1)[-1])  # the bare token after "Bearer "
            self._values = tuple(sorted((v for v in values if len(v) >= 4), key=len,
                                        reverse=True))

    def __len__(self) -> int:
        """How many values are redacted now."""
        return len(self._values)

    def redact(self, text: str) -> str:
        for secret in self._values:  # a tuple replaced whole: no lock needed to read it
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


def file_id(path: Optional[str]) -> FileId:
    """What tells a replaced file from the one read before (through symlinks); None if absent."""
    if not path:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size


class Credentials:
    """The Authorization header and client certificate files of one kubeconfig (see above).

    :param settings: what the kubeconfig names (:mod:`multusd.kube.kubeconfig`).
    :param secrets: where every token goes, for redaction.
    :param plugin: for a credential-plugin user, the package's Configuration and a function
        that runs the package's loader again and returns a new one.
    """

    def __init__(self, settings: kubeconfig.Settings, secrets: Secrets, *,
                 plugin: Optional[Tuple[Any, Callable[[], Any]]] = None) -> None:
        self.settings = settings
        self.secrets = secrets
        self._lock = threading.Lock()
        self._plugin_configuration, self._reload_plugin = plugin or (None, None)
        self._plugin_loaded_at = 0.0  # the first reload after a 401 is not held back
        self._header: Optional[str] = None
        self._token_id: FileId = None
        self._token_read_at = 0.0
        self._tls_ids = self._tls_files()
        self.tls_generation = 0
        self.rotations = 0  # how many times a credential was found replaced
        if settings.token:
            self._header = f"Bearer {settings.token}"
        elif settings.basic:
            self._header = kubeconfig.basic_header(settings.basic)
        elif settings.token_file:
            self._read_token_file(force=True)
        self.secrets.add(self._header, AUTHORIZATION)
        if settings.basic:
            self.secrets.add(settings.basic.split(":", 1)[-1], "password")

    @property
    def rotates(self) -> bool:
        """Whether anything here can change (a token file, client certificate or plugin)."""
        return bool(self.settings.token_file or self.settings.cert_file or
                    self._plugin_configuration is not None)

    def header(self) -> Optional[str]:
        """The Authorization header value to send now (None: no credentials but TLS's)."""
        if self.settings.token_file:
            self._read_token_file(force=False)
        elif self._plugin_configuration is not None:
            header = kubeconfig.configuration_token(self._plugin_configuration)
            if header != self._header:
                with self._lock:
                    self._header = header
                self.secrets.add(header, AUTHORIZATION)
        self._check_tls()
        return self._header

    def refresh(self) -> bool:
        """After a 401: re-read every credential now; True if any of them changed."""
        before = (self._header, self.tls_generation)
        if self.settings.token_file:
            self._read_token_file(force=True)
        elif self._reload_plugin is not None:
            self._reload_plugin_configuration()
        self._check_tls()
        return (self._header, self.tls_generation) != before

    # ---- token file ----------------------------------------------------------------------------

    def _read_token_file(self, *, force: bool) -> None:
        path = self.settings.token_file
        current = file_id(path)
        now = time.monotonic()
        if not force and current == self._token_id and now - self._token_read_at < TOKEN_REREAD:
            return
        with self._lock:
            try:
                token = kubeconfig.read_token_file(path)
            except (OSError, ValueError) as exc:  # mid-rotation: keep the token we have
                if self._header is None:
                    raise kubeconfig.KubeconfigError(
                        f"its 'tokenFile' {path!r} cannot be read "
                        f"({type(exc).__name__})") from None
                LOG.warning("cannot re-read the token file %s (%s); keeping the token read "
                            "before", path, type(exc).__name__)
                self._token_read_at = now
                return
            header = f"Bearer {token}"
            if self._header is not None and header != self._header:
                self.rotations += 1
                LOG.info("the token in %s was replaced; using the new one", path)
            self.secrets.add(header, AUTHORIZATION)
            self._header, self._token_id, self._token_read_at = header, current, now

    # ---- credential plugins --------------------------------------------------------------------

    def _reload_plugin_configuration(self) -> None:
        with self._lock:
            if time.monotonic() - self._plugin_loaded_at < PLUGIN_RELOAD_PAUSE:
                return
            self._plugin_loaded_at = time.monotonic()
            try:
                configuration = self._reload_plugin()
            except Exception as exc:  # noqa: BLE001 - keep the old one, say why (type only)
                LOG.warning("running the kubeconfig's credential plugin again failed (%s)",
                            type(exc).__name__)
                return
            self._plugin_configuration = configuration
        header = kubeconfig.configuration_token(configuration)
        if header != self._header:
            self.rotations += 1
            self.secrets.add(header, AUTHORIZATION)
            self._header = header

    # ---- client certificate --------------------------------------------------------------------

    def _tls_files(self) -> Tuple[FileId, FileId]:
        return file_id(self.settings.cert_file), file_id(self.settings.key_file)

    def _check_tls(self) -> None:
        if not self.settings.cert_file:
            return
        current = self._tls_files()
        if current != self._tls_ids and all(current):
            with self._lock:
                if current != self._tls_ids:
                    self._tls_ids = current
                    self.tls_generation += 1
                    self.rotations += 1
                    LOG.info("the client certificate %s was replaced; new connections use it",
                             self.settings.cert_file)
