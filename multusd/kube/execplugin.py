"""Exec credential plugins, run by multusd itself within a deadline (client.authentication.k8s.io).

A kubeconfig user with ``exec`` names a program that prints the credential (a token, or a
client certificate and key) as an ``ExecCredential``. The ``kubernetes`` package runs it with
``subprocess.Popen(...).communicate()`` and no timeout (releases 22.6 to 37.x alike), so a
plugin that hangs (a cloud CLI waiting on its metadata server, a login prompt) would hold a
request, or the daemon's start, forever. Here the protocol is run directly:

* the command (a name looked up on ``PATH``, or a path, relative ones from the kubeconfig's
  directory, which is also its working directory, as the package and client-go do), its
  ``args`` and ``env`` on top of the daemon's environment, ``KUBERNETES_EXEC_INFO`` with
  ``interactive: false`` and, with ``provideClusterInfo``, the cluster; stdin is
  ``/dev/null``: multusd is never interactive, and ``interactiveMode: Always`` is refused;
* in a session of its own, killed with all it started (SIGKILL to the process group) when
  the deadline passes: :data:`PLUGIN_TIMEOUT` seconds, or the request's deadline when a
  request made it run (an expired token found by a request, a 401);
* its answer must be an ``ExecCredential`` of the ``apiVersion`` asked for, with a
  ``token`` or ``clientCertificateData`` and ``clientKeyData`` (written to root-only files,
  :func:`multusd.kube.kubeconfig.data_file`); ``expirationTimestamp`` says when to run it
  again (:data:`EXPIRY_SKEW` before), else it is run again after a 401 only.

Nothing of its output reaches a message: a failure names the command, the exit status and at
most the last line of its stderr, with every known credential cut out by the caller's
redaction (:class:`multusd.kube.credentials.Secrets`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, NamedTuple, Optional

from multusd.errors import MultusError, TryAgainLater
from multusd.kube.kubeconfig import ExecPlugin, KubeconfigError, data_file

PLUGIN_TIMEOUT = 30.0  # a plugin that has not answered by then is killed
EXPIRY_SKEW = 10.0  # run it again this long before its credential expires
STDERR_SHOWN = 200  # characters of the last stderr line a failure quotes
_REAP_WAIT = 2.0  # after the kill: how long it may take to exit (only a kernel wait does)


class CredentialPluginError(KubeconfigError):
    """The kubeconfig's credential plugin failed, timed out, or printed no usable credential."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient

    def as_error(self, action: str) -> MultusError:
        """The CNI error of a request that needed the plugin (a timeout: try again)."""
        kind = TryAgainLater if self.transient else MultusError
        return kind(f"cannot {action}: {self}")


class ExecCredential(NamedTuple):
    """What one run of the plugin gave: the Authorization header or a client certificate."""

    header: Optional[str]
    cert_file: Optional[str]
    key_file: Optional[str]
    expires: Optional[float]  # wall clock (time.time()); None: until a 401

    def expired(self, now: Optional[float] = None) -> bool:
        if self.expires is None:
            return False
        return (time.time() if now is None else now) >= self.expires - EXPIRY_SKEW


def run(plugin: ExecPlugin, deadline: float, *,
        redact: Callable[[str], str] = lambda text: text) -> ExecCredential:
    """Run the plugin once, killed at ``deadline`` (a ``time.monotonic()`` instant).

    :raises CredentialPluginError: it did not finish in time (``transient``), could not be
        started, failed, or printed no usable ExecCredential; the message names the command
        and says what to check, never what it printed on stdout.
    """
    info: Dict[str, Any] = {"apiVersion": plugin.api_version, "kind": "ExecCredential",
                            "spec": {"interactive": False}}
    if plugin.cluster is not None:
        info["spec"]["cluster"] = json.loads(plugin.cluster)
    env = dict(os.environ)
    env.update(plugin.env)
    env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
    command = plugin.command
    if "/" in command and not os.path.isabs(command):
        command = os.path.join(plugin.cwd, command)
    started = time.monotonic()
    try:
        process = subprocess.Popen([command, *plugin.args], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   cwd=plugin.cwd or None, env=env, start_new_session=True,
                                   close_fds=True)
    except OSError as exc:
        hint = f" ({plugin.install_hint})" if plugin.install_hint else ""
        raise CredentialPluginError(
            f"the kubeconfig's credential plugin {plugin.name!r} cannot be started "
            f"({exc.strerror or type(exc).__name__}){hint}; check that it is installed "
            "where the kubeconfig's 'exec' says") from None
    try:
        stdout, stderr = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(process)
        raise CredentialPluginError(
            f"the kubeconfig's credential plugin {plugin.name!r} did not finish within "
            f"{time.monotonic() - started:.1f}s and was killed; check that it can run "
            "unattended on this node (no prompt, its own servers reachable)",
            transient=True) from None
    except BaseException:
        _kill(process)
        raise
    if process.returncode != 0:
        raise CredentialPluginError(
            f"the kubeconfig's credential plugin {plugin.name!r} failed (exit status "
            f"{process.returncode}){_last_line(stderr, redact)}; run it by hand to see why")
    return _credential(plugin, stdout)


def _kill(process: Any) -> None:
    """SIGKILL the plugin and what it started (its session's group), reap it; its pipes are
    closed, not read to their end (a descendant that left the group may hold them open past
    the deadline), as :mod:`multusd.cni.invoke` does to a delegate plugin."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    try:
        process.wait(_REAP_WAIT)
    except subprocess.TimeoutExpired:
        pass  # stuck in the kernel: subprocess reaps it later (its _active list)


def _last_line(stderr: bytes, redact: Callable[[str], str]) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()
             if line.strip()]
    return f": {redact(lines[-1])[:STDERR_SHOWN]}" if lines else ""


def _credential(plugin: ExecPlugin, stdout: bytes) -> ExecCredential:
    """The credential in the plugin's answer (see the module docstring)."""
    def refuse(what: str) -> CredentialPluginError:
        return CredentialPluginError(f"the kubeconfig's credential plugin {plugin.name!r} "
                                     f"printed {what}; it must print an ExecCredential")

    try:
        answer = json.loads(stdout)
    except ValueError:
        raise refuse("something that is not JSON") from None
    if not isinstance(answer, dict) or answer.get("kind") != "ExecCredential":
        raise refuse("JSON that is not an ExecCredential")
    if answer.get("apiVersion") != plugin.api_version:
        raise refuse(f"apiVersion {str(answer.get('apiVersion'))[:80]!r}, not the "
                     f"{plugin.api_version!r} asked for")
    status = answer.get("status")
    if not isinstance(status, dict):
        raise refuse("an ExecCredential without a status")
    expires = _expiry(status.get("expirationTimestamp"))
    token = status.get("token")
    if isinstance(token, str) and token:
        return ExecCredential(f"Bearer {token}", None, None, expires)
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if isinstance(cert, str) and cert and isinstance(key, str) and key:
        return ExecCredential(None, data_file(cert.encode()), data_file(key.encode()), expires)
    raise refuse("an ExecCredential with neither a token nor a client certificate and key")


def _expiry(value: Any) -> Optional[float]:
    """An RFC 3339 ``expirationTimestamp`` as wall-clock seconds (None: absent, unreadable)."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
    if "." in text:  # any fraction as 6 digits (3.9's fromisoformat takes 3 or 6 only)
        head, _, rest = text.partition(".")
        offset = rest.lstrip("0123456789")  # the digits end where the offset begins
        digits = rest[:len(rest) - len(offset)]
        text = f"{head}.{(digits + '000000')[:6]}{offset}"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()
