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
* an ``exec`` credential plugin is run here (:mod:`multusd.kube.execplugin`), never past
  :data:`~multusd.kube.execplugin.PLUGIN_TIMEOUT` nor past the deadline of the request that
  needs it: once for the first request, again when its credential expires and after a 401
  (at most every :data:`PLUGIN_RELOAD_PAUSE` seconds), by one request at a time (the others
  wait for its credential, within their own deadlines); a client certificate it prints
  bumps :attr:`Credentials.tls_generation` when it changes;
* an ``auth-provider`` user's token is the ``kubernetes`` package's: its Configuration's
  ``refresh_api_key_hook`` runs the provider again once the token expired; after a 401 the
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

from multusd.kube import execplugin, kubeconfig
from multusd.kube.deadlines import left, within
from multusd.kube.execplugin import CredentialPluginError

__all__ = ["Credentials", "CredentialPluginError", "Secrets", "REDACTED"]

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
        self._exec = settings.exec_plugin
        self._exec_lock = threading.Lock()  # one run of the exec plugin at a time
        self._exec_credential: Optional[execplugin.ExecCredential] = None
        self._exec_reloaded_at = 0.0  # the first run after a 401 is not held back
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
                    self._plugin_configuration is not None or self._exec is not None)

    def client_certificate(self) -> Tuple[Optional[str], Optional[str]]:
        """The client certificate and key files to present now (the exec plugin's, if it
        gave a pair, else the kubeconfig's); (None, None) for none."""
        credential = self._exec_credential
        if credential is not None and credential.cert_file:
            return credential.cert_file, credential.key_file
        return self.settings.cert_file, self.settings.key_file

    def header(self, deadline: Optional[float] = None) -> Optional[str]:
        """The Authorization header value to send now (None: no credentials but TLS's).

        :param deadline: when the request that asks must be over; an exec plugin that has to
            run for it is killed then (``time.monotonic()``; None: its own timeout only).
        :raises CredentialPluginError: the exec plugin had to run and failed or timed out.
        """
        if self.settings.token_file:
            self._read_token_file(force=False)
        elif self._exec is not None:
            credential = self._exec_credential
            if credential is None or credential.expired():
                self._run_exec(deadline, credential)
        elif self._plugin_configuration is not None:
            header = kubeconfig.configuration_token(self._plugin_configuration)
            if header != self._header:
                with self._lock:
                    self._header = header
                self.secrets.add(header, AUTHORIZATION)
        self._check_tls()
        return self._header

    def refresh(self, deadline: Optional[float] = None) -> bool:
        """After a 401: re-read every credential now; True if any of them changed.

        :param deadline: as for :meth:`header`.
        :raises CredentialPluginError: the exec plugin failed or timed out.
        """
        before = (self._header, self.tls_generation)
        if self.settings.token_file:
            self._read_token_file(force=True)
        elif self._exec is not None:
            self._run_exec(deadline, self._exec_credential, after_401=True)
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

    # ---- exec plugins run here -------------------------------------------------------------

    def _run_exec(self, deadline: Optional[float], seen: Optional[execplugin.ExecCredential],
                  after_401: bool = False) -> None:
        """Run the exec plugin for a credential newer than ``seen``, by ``deadline``; a
        request that finds it running waits for that run's credential instead. After a
        401 it runs at most every :data:`PLUGIN_RELOAD_PAUSE` seconds."""
        plugin = self._exec
        assert plugin is not None
        until = within(execplugin.PLUGIN_TIMEOUT, deadline)
        if not self._exec_lock.acquire(timeout=max(0.0, left(until))):
            raise CredentialPluginError(
                f"the kubeconfig's credential plugin {plugin.name!r}, run for another request, "
                "did not finish in time; check that it can run unattended on this node",
                transient=True)
        try:
            if self._exec_credential is not seen:
                return  # another request ran it meanwhile
            if after_401:
                if time.monotonic() - self._exec_reloaded_at < PLUGIN_RELOAD_PAUSE:
                    return
                self._exec_reloaded_at = time.monotonic()
            if until <= time.monotonic():
                raise CredentialPluginError(
                    f"the kubeconfig's credential plugin {plugin.name!r} could not run: the "
                    "request's deadline passed first", transient=True)
            credential = execplugin.run(plugin, until, redact=self.secrets.redact)
            self.secrets.add(credential.header, AUTHORIZATION)
            changed = seen is not None and credential[:3] != seen[:3]  # not just its expiry
            if seen is not None and credential[1:3] != seen[1:3]:
                self.tls_generation += 1  # a new client certificate: new connections
            self._exec_credential = credential
            self._header = credential.header
            if changed:
                self.rotations += 1
        finally:
            self._exec_lock.release()

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
