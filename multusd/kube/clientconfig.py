"""Client configuration from a kubeconfig, the one translation of request failures, redaction.

:class:`ClientConfig` reads the kubeconfig (:mod:`multusd.kube.kubeconfig`; an ``exec``
credential plugin is run by :mod:`multusd.kube.execplugin`, an ``auth-provider`` user goes
through the ``kubernetes`` package's own loader) and builds the transport
(:mod:`multusd.kube.transport`) and its rotating credentials.
Foreign exceptions (:class:`~multusd.kube.transport.ApiError`, socket, TLS and HTTP errors) are
translated in one place, :meth:`ClientConfig.failure`: 429/5xx and connection errors (a TLS
connection cut without an answer among them) become :class:`~multusd.errors.TryAgainLater`
(saying how many attempts the transport made), a request cut at its deadline
:class:`~multusd.errors.TryAgainLater` too, naming the server's ``host:port``, the rest
:class:`~multusd.errors.MultusError`, naming the API server URL and the fix. Credentials
(tokens, kubeconfig contents, keys) never reach a log line or an error message: the loader's
parse errors are reduced to their type, and every token seen is redacted from the API
server's own messages.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
from typing import Any, Optional, Tuple

from multusd.errors import InvalidNetworkConfig, MultusError, TryAgainLater
from multusd.kube import retries
from multusd.kube.credentials import CredentialPluginError, Credentials, Secrets
from multusd.kube.identity import CertificateError, node_name_from_certificate
from multusd.kube.kubeconfig import KubeconfigError, Settings, from_configuration, load
from multusd.kube.transport import POOL_SIZE, ApiError, IdleTimeout, NoAnswerInTime, Transport

LOG = logging.getLogger(__name__)
RBAC_FILE = "/usr/share/multusd/rbac.yaml"


class WatchError(Exception):
    """An ERROR event in a watch stream (handled like the HTTP error it carries)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = message
        self.status_reason = reason  # metav1.Status reason: "Expired", "Timeout", ...
        self.body = json.dumps({"message": message})


class ClientConfig:
    """The API server of one kubeconfig: its transport, credentials and secrets.

    :param kubeconfig: path of a kubeconfig (token, tokenFile, client certificate, CA, or a
        credential plugin).
    :param pool_size: idle kept-alive connections the transport keeps at most.
    :raises InvalidNetworkConfig: it cannot be loaded (the message says why, without its
        contents).
    """

    def __init__(self, kubeconfig: str, *, pool_size: int = POOL_SIZE) -> None:
        self.kubeconfig = kubeconfig
        self.secrets = Secrets()
        self.settings, self.credentials = self._load(kubeconfig)
        self.server_url: str = self.settings.host
        try:
            self.transport = Transport(self.settings, self.credentials, pool_size=pool_size)
        except KubeconfigError as exc:
            raise self._unusable(str(exc)) from None

    def _unusable(self, reason: str) -> InvalidNetworkConfig:
        return InvalidNetworkConfig(
            f"cannot use kubeconfig {self.kubeconfig!r}: {reason}; point 'kubeconfig' in "
            "daemon-config.json at a kubeconfig with a server and credentials for this node")

    def _load(self, kubeconfig: str) -> Tuple[Settings, Credentials]:
        """Settings and credentials; only a credential plugin needs the package's loader."""
        try:
            settings = load(kubeconfig, exec_plugins=True)  # exec: run here, with a timeout
            if settings is None:  # auth-provider
                configuration = _load_with_credential_plugin(kubeconfig)
                settings = from_configuration(configuration)
                credentials = Credentials(
                    settings, self.secrets,
                    plugin=(configuration, lambda: _load_with_credential_plugin(kubeconfig)))
            else:
                credentials = Credentials(settings, self.secrets)
            credentials.header()  # a plugin runs now (bounded): its failure is a start-up one
        except KubeconfigError as exc:
            # Both loaders' messages name keys and files, not values, so they are kept.
            # Nothing is chained (from None): a traceback in the journal must not carry more.
            raise self._unusable(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - OSError, YAML errors, bad base64 ...
            # parser errors quote the offending line, which may hold the token: type only
            raise InvalidNetworkConfig(
                f"cannot use kubeconfig {kubeconfig!r}: {type(exc).__name__} while reading it; "
                "check that the file exists, is readable by root and is a valid kubeconfig"
            ) from None
        if not settings.host:
            raise InvalidNetworkConfig(
                f"kubeconfig {kubeconfig!r} has no 'server' in the cluster of its current "
                "context; add the API server's URL (https://<host>:<port>)")
        return settings, credentials

    def node_identity(self) -> Optional[str]:
        """The node name the client certificate proves (``CN=system:node:<name>``), else None.

        Reads ``client-certificate`` or ``client-certificate-data`` of the current user (the
        loader has made a file of either); a certificate that cannot be read is logged.
        """
        path = self.settings.cert_file
        if not path:
            return None
        try:
            with open(path, "rb") as handle:
                return node_name_from_certificate(handle.read())
        except (OSError, CertificateError) as exc:
            LOG.warning("cannot read the client certificate of kubeconfig %r for this node's "
                        "name: %s", self.kubeconfig, exc)
            return None

    def redact(self, text: str) -> str:
        """``text`` without any credential of the kubeconfig."""
        return self.secrets.redact(text)

    @staticmethod
    def request_errors() -> Tuple[type, ...]:
        """The exceptions a request may raise, for ``except`` clauses before :meth:`failure`."""
        return (ApiError, WatchError, IdleTimeout, OSError, http.client.HTTPException,
                ValueError)

    def failure(self, exc: BaseException, action: str) -> MultusError:
        """The MultusError for a failed request (the one translation point of kube/)."""
        where = f"the Kubernetes API server at {self.server_url}"
        if isinstance(exc, NoAnswerInTime):
            return TryAgainLater(
                f"cannot {action}: the Kubernetes API server {exc.server} did not answer in "
                f"time: no answer within the request's time ({exc.waited:.1f}s; cut during "
                f"{exc.stage}){_tries(exc)}; it is overloaded or the network to it is "
                "congested: check its health and load, and that the 'server' of kubeconfig "
                f"{self.kubeconfig!r} ({self.server_url}) is the right one")
        if isinstance(exc, CredentialPluginError):
            return exc.as_error(action)
        if isinstance(exc, json.JSONDecodeError):
            return MultusError(f"cannot {action}: {where} answered with something that is not "
                               "JSON; check that 'server' in kubeconfig "
                               f"{self.kubeconfig!r} points at a Kubernetes API server")
        if isinstance(exc, ValueError) and not _is_tls_failure(exc):  # it may quote a header
            return MultusError(f"cannot {action}: the request to {where} could not be built "
                               f"({type(exc).__name__}); check the credentials in kubeconfig "
                               f"{self.kubeconfig!r}")
        if isinstance(exc, (ApiError, WatchError)):
            status = int(exc.status or 0)
            detail = self.redact(status_detail(exc))
            if status == 401:
                return MultusError(
                    f"cannot {action}: {where} rejected multusd's credentials (401 Unauthorized);"
                    f" check the token or client certificate in kubeconfig {self.kubeconfig!r}"
                    " (a token file or rotated certificate is re-read on every 401)")
            if status == 403:
                return MultusError(
                    f"cannot {action}: {where} forbids it (403 Forbidden: {detail}); multusd "
                    "needs pods get/list/watch, pods/status update, events create and "
                    "network-attachment-definitions get/list/watch: with the node's own "
                    f"kubeconfig `kubectl apply -f {RBAC_FILE}` (once per cluster) adds what "
                    "the Node authorizer does not grant; a service account needs upstream's "
                    "multus ClusterRole")
            if status == 429 or status >= 500:
                return TryAgainLater(f"cannot {action}: {where} answered {status} ({detail})"
                                     f"{_tries(exc)}; it is overloaded or restarting, try again")
            return MultusError(f"cannot {action}: {where} answered {status} ({detail})")
        reason = self.redact(connection_reason(exc))
        transient = retries.connection_failure(exc) is not None  # a TLS EOF is a cut, too
        if not transient and (_is_tls_failure(exc) or "SSL" in reason or
                              "certificate" in reason.lower()):
            return MultusError(
                f"cannot {action}: {where} failed the TLS handshake ({reason}); check "
                f"'certificate-authority' and the client certificate in {self.kubeconfig!r}")
        return TryAgainLater(
            f"cannot {action}: {where} is unreachable ({reason}){_tries(exc)}; check that it is "
            f"running and that the 'server' of kubeconfig {self.kubeconfig!r} is right")

    def close(self) -> None:
        self.transport.close()


def _load_with_credential_plugin(kubeconfig: str) -> Any:
    """The package's own loader, for ``exec`` and ``auth-provider`` users: a Configuration."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                persist_config=False)
    except config.ConfigException as exc:
        raise KubeconfigError(str(exc)) from None
    return configuration


def status_detail(exc: Any) -> str:
    """The API server's own message from an error response (its Status body), else the reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
        message = body.get("message") if isinstance(body, dict) else None
    except (TypeError, ValueError):
        message = None
    text = str(message or exc.reason or "no reason given")
    return text.splitlines()[0][:300] if text else text


def _tries(exc: BaseException) -> str:
    """" after N attempts" when the transport sent the request more than once."""
    attempts = getattr(exc, "attempts", 1)
    return f" after {attempts} attempts" if isinstance(attempts, int) and attempts > 1 else ""


def _is_tls_failure(exc: BaseException) -> bool:
    return isinstance(exc, (ssl.SSLError, ssl.CertificateError))


def connection_reason(exc: BaseException) -> str:
    """A short reason for a connection-level failure, in the OS's or TLS's words."""
    if isinstance(exc, (socket.timeout, IdleTimeout)) or "timed out" in str(exc):
        return "no answer within the request's time"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
                        http.client.IncompleteRead)):
        return "the connection was cut"
    if retries.connection_failure(exc) == "tls-eof":
        return "the TLS connection was cut"
    if isinstance(exc, http.client.HTTPException):
        return f"its answer is not HTTP ({type(exc).__name__})"
    if isinstance(exc, ssl.SSLError):
        return str(getattr(exc, "verify_message", "") or exc.reason or exc)[:300]
    text = str(exc)
    if "]" in text and "Errno" in text:
        text = text[text.index("[Errno"):]
    return text[:300]
