"""Client configuration from a kubeconfig, the one translation of request failures, redaction.

Foreign exceptions (``ApiException``, urllib3 and socket errors) are translated in one place,
:meth:`ClientConfig.failure`: 429/5xx and connection errors become
:class:`~multusd.errors.TryAgainLater`, the rest :class:`~multusd.errors.MultusError`, naming
the API server URL. Credentials (tokens, kubeconfig contents, keys) never reach a log line or
an error message: the loader's parse errors are reduced to their type, and every token the
kubeconfig holds is redacted from the API server's own messages.
``kubernetes`` and ``urllib3`` are imported inside the functions, so importing this is cheap.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional, Set, Tuple

from multusd.errors import InvalidNetworkConfig, MultusError, TryAgainLater
from multusd.kube import kubeconfig as kubeconfig_reader
from multusd.kube.identity import CertificateError, node_name_from_certificate

LOG = logging.getLogger(__name__)
REDACTED = "<redacted>"


class WatchError(Exception):
    """An ERROR event in a watch stream (handled like the HTTP error it carries)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = message
        self.status_reason = reason  # metav1.Status reason: "Expired", "Timeout", ...
        self.body = json.dumps({"message": message})


class ClientConfig:
    """A private ``kubernetes`` Configuration loaded from one kubeconfig, and its secrets.

    :param kubeconfig: path of a kubeconfig (token, tokenFile, client certificate, CA).
    :raises InvalidNetworkConfig: it cannot be loaded (the message says why, without its
        contents).
    """

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self._secrets: Set[str] = set()
        self.configuration = self._load(kubeconfig)
        self.server_url: str = self.configuration.host

    def _load(self, kubeconfig: str) -> Any:
        """A private client Configuration from the kubeconfig (never the global default).

        :mod:`multusd.kube.kubeconfig` reads it; only a credential plugin (``exec``,
        ``auth-provider``) needs the package's own loader.
        """
        import urllib3
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = ""  # stays empty when the kubeconfig names no server
        try:
            if not kubeconfig_reader.load(kubeconfig, configuration):
                _load_with_credential_plugin(kubeconfig, configuration)
        except kubeconfig_reader.KubeconfigError as exc:
            # Both loaders' messages name keys and files, not values, so they are kept.
            # Nothing is chained (from None): a traceback in the journal must not carry more.
            reason = str(exc)
            raise InvalidNetworkConfig(
                f"cannot use kubeconfig {kubeconfig!r}: {reason}; point 'kubeconfig' in "
                "daemon-config.json at a kubeconfig with a server and credentials for this node"
            ) from None
        except Exception as exc:  # noqa: BLE001 - OSError, YAML errors, bad base64 ...
            # parser errors quote the offending line, which may hold the token: type only
            raise InvalidNetworkConfig(
                f"cannot use kubeconfig {kubeconfig!r}: {type(exc).__name__} while reading it; "
                "check that the file exists, is readable by root and is a valid kubeconfig"
            ) from None
        if not configuration.host:
            raise InvalidNetworkConfig(
                f"kubeconfig {kubeconfig!r} has no 'server' in the cluster of its current "
                "context; add the API server's URL (https://<host>:<port>)")
        for name, value in list(configuration.api_key.items()):
            # a tokenFile usually ends in a newline, which no HTTP header may carry
            value = configuration.api_key[name] = value.strip()
            self._secrets.add(value)
            self._secrets.add(value.split(" ", 1)[-1])  # the bare token after "Bearer "
        configuration.debug = False  # http.client would print request headers (the token)
        # One quick retry covers a pooled keep-alive connection the server already closed;
        # longer waits are the callers' business (backoff in the watches, TryAgainLater).
        configuration.retries = urllib3.Retry(total=1, connect=1, read=1, redirect=0, status=0,
                                              raise_on_status=False)
        configuration.connection_pool_maxsize = 8
        return configuration

    def node_identity(self) -> Optional[str]:
        """The node name the client certificate proves (``CN=system:node:<name>``), else None.

        Reads ``client-certificate`` or ``client-certificate-data`` of the current user (the
        loader has made a file of either); a certificate that cannot be read is logged.
        """
        path = getattr(self.configuration, "cert_file", None)
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
        for secret in sorted(self._secrets, key=len, reverse=True):
            if len(secret) >= 4:
                text = text.replace(secret, REDACTED)
        return text

    @staticmethod
    def request_errors() -> Tuple[type, ...]:
        """The exceptions a request may raise, for ``except`` clauses before :meth:`failure`."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        return (ApiException, WatchError, urllib3.exceptions.HTTPError, OSError, ValueError)

    def failure(self, exc: BaseException, action: str) -> MultusError:
        """The MultusError for a failed request (the one translation point of kube/)."""
        from kubernetes.client.exceptions import ApiException

        where = f"the Kubernetes API server at {self.server_url}"
        if isinstance(exc, json.JSONDecodeError):
            return MultusError(f"cannot {action}: {where} answered with something that is not "
                               "JSON; check that 'server' in kubeconfig "
                               f"{self.kubeconfig!r} points at a Kubernetes API server")
        if isinstance(exc, ValueError):  # its text may quote a header, that is the token
            return MultusError(f"cannot {action}: the request to {where} could not be built "
                               f"({type(exc).__name__}); check the credentials in kubeconfig "
                               f"{self.kubeconfig!r}")
        if isinstance(exc, (ApiException, WatchError)):
            status = int(exc.status or 0)
            detail = self.redact(status_detail(exc))
            if status == 0 and "SSL" in str(exc.reason):
                return MultusError(
                    f"cannot {action}: {where} failed the TLS handshake ({detail}); check "
                    f"'certificate-authority' and the client certificate in {self.kubeconfig!r}")
            if status == 401:
                return MultusError(
                    f"cannot {action}: {where} rejected multusd's credentials (401 Unauthorized);"
                    f" check the token or client certificate in kubeconfig {self.kubeconfig!r}")
            if status == 403:
                return MultusError(
                    f"cannot {action}: {where} forbids it (403 Forbidden: {detail}); grant the "
                    "user of kubeconfig the multus ClusterRole rules (pods and pods/status: get, "
                    "list, watch, update; network-attachment-definitions: get, list, watch; "
                    "events: create)")
            if status == 429 or status >= 500:
                return TryAgainLater(f"cannot {action}: {where} answered {status} ({detail}); "
                                     "it is overloaded or restarting, try again")
            return MultusError(f"cannot {action}: {where} answered {status} ({detail})")
        reason = self.redact(connection_reason(exc))
        return TryAgainLater(
            f"cannot {action}: {where} is unreachable ({reason}); check that it is running and "
            f"that the 'server' of kubeconfig {self.kubeconfig!r} is right")


def _load_with_credential_plugin(kubeconfig: str, configuration: Any) -> None:
    """The package's own loader, for ``exec`` and ``auth-provider`` users."""
    from kubernetes import config

    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                persist_config=False)
    except config.ConfigException as exc:
        raise kubeconfig_reader.KubeconfigError(str(exc)) from None


def status_detail(exc: Any) -> str:
    """The API server's own message from an error response (its Status body), else the reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
        message = body.get("message") if isinstance(body, dict) else None
    except (TypeError, ValueError):
        message = None
    text = str(message or exc.reason or "no reason given")
    return text.splitlines()[0][:300] if text else text


def connection_reason(exc: BaseException) -> str:
    """A short reason for a connection-level failure (the innermost cause of urllib3's error)."""
    import urllib3

    if isinstance(exc, urllib3.exceptions.ProtocolError):
        return "the connection was cut"
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "no answer within the read timeout"
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    # urllib3 repeats the connection object's repr; the part after ": " is the OS's words
    if "]" in text and "Errno" in text:
        text = text[text.index("[Errno"):]
    return text[:300]
