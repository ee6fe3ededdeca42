"""The daemon's Kubernetes client, built (node name, kubeconfig, watches) on a thread of its own.

Reading the kubeconfig and importing the transport (http.client, ssl, yaml) costs tens of ms,
and a credential plugin user imports the whole ``kubernetes`` package: building the client
before serving would hold up ``/healthz`` and every shim queued on a socket-activated
start. Until it is built the daemon is not :meth:`BackgroundKube.ready` (``/readyz``
answers 500, as while the first list runs). The requests that need the client (the lookups
and writes of an ADD, DEL, CHECK) wait for it through :meth:`BackgroundKube.wait_for_client`,
each one named below; everything else (readiness, status lines, ``/status``, metrics) reads
:attr:`BackgroundKube.client` and never waits. A kubeconfig that cannot be loaded stops the
daemon (``failure`` says why), as it did when the client was built before serving.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional, Tuple

from multusd.config import nodename
from multusd.daemon import log
from multusd.errors import MultusError, TryAgainLater

LOG = logging.getLogger(__name__)


class BackgroundKube:
    """A :class:`~multusd.kube.client.KubeClient` being built, and what the core asks of it.

    The lookups and writes wait for the client (:meth:`wait_for_client`, up to
    :attr:`BUILD_WAIT` s); :meth:`ready`, :meth:`synced`, :attr:`last_error` and
    :attr:`server_url` never wait.
    """

    BUILD_WAIT = 60.0

    def __init__(self, kubeconfig: str, configured_node_name: str,
                 on_failure: Callable[[], None],
                 on_built: Callable[[], None] = lambda: None, *, pool_size: int = 0,
                 pod_listener: Optional[Callable[[Any], None]] = None) -> None:
        self.kubeconfig = kubeconfig
        self.pod_listener = pod_listener  # handed every pod the watch delivers, from its start
        self.pool_size = pool_size  # idle API connections to keep (0: the transport's default)
        self.configured_node_name = configured_node_name
        self.failure: Optional[str] = None
        self.node: Optional[nodename.NodeName] = None
        self.client: Any = None  # the KubeClient, once built and started
        self._on_failure = on_failure
        self._on_built = on_built
        self._built = threading.Event()

    def start_building(self) -> None:
        threading.Thread(target=self._build, name="multusd-k8s-start", daemon=True).start()

    def _build(self) -> None:
        try:
            from multusd.kube.client import KubeClient
            from multusd.kube.clientconfig import ClientConfig
            from multusd.kube.transport import POOL_SIZE

            client_config = ClientConfig(self.kubeconfig, pool_size=self.pool_size or POOL_SIZE)
            log.redact_with(client_config.redact)
            self.node = nodename.resolve(self.configured_node_name, os.environ,
                                         client_config.node_identity)
            LOG.info("%s", self.node.describe())
            client = KubeClient(client_config, self.node.name, node_source=self.node.source)
            if self.pod_listener is not None:
                client.add_pod_listener(self.pod_listener)
            client.start()
            self.client = client
        except Exception as exc:  # reported, and the daemon stops: it cannot serve ADD
            self.failure = (exc.msg if isinstance(exc, MultusError) else
                            f"cannot set up the Kubernetes client from {self.kubeconfig}: {exc}")
            LOG.error("%s", self.failure)
        finally:
            self._built.set()
        if self.failure is not None:
            self._on_failure()
        else:
            self._on_built()

    # ---- what never waits ---------------------------------------------------------------------

    def ready(self) -> bool:
        """Built, and its pod cache has listed once (see :meth:`KubeClient.ready`)."""
        return self.client is not None and self.client.ready()

    def synced(self) -> bool:
        """Built, and its pod cache is complete and not known stale."""
        return self.client is not None and self.client.synced()

    def cached_pod(self, namespace: str, name: str) -> Any:
        """The pod as the watch cache has it now (None before the client is built)."""
        return None if self.client is None else self.client.cached_pod(namespace, name)

    @property
    def node_mismatch(self) -> Optional[Tuple[str, str]]:
        """:attr:`KubeClient.node_mismatch` (None before the client is built)."""
        return None if self.client is None else self.client.node_mismatch

    @property
    def last_error(self) -> Optional[str]:
        if self.client is None:
            return self.failure or "the Kubernetes client is still starting"
        return self.client.last_error

    @property
    def server_url(self) -> str:
        """The API server's URL once the client is built (until then, the kubeconfig's)."""
        if self.client is None:
            return f"the API server of {self.kubeconfig}"
        return self.client.server_url

    def stop(self) -> None:
        if self.client is not None:
            self.client.stop()

    # ---- what waits for the client -------------------------------------------------------------

    def wait_for_client(self) -> Any:
        """The built :class:`~multusd.kube.client.KubeClient`, waiting up to
        :attr:`BUILD_WAIT` s for it.

        :raises TryAgainLater: it is not built by then, or could not be built.
        """
        if not self._built.wait(self.BUILD_WAIT) or self.client is None:
            raise TryAgainLater(f"the Kubernetes client is not available: "
                                f"{self.failure or 'still starting'}")
        return self.client

    def get_pod(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`KubeClient.get_pod`, after :meth:`wait_for_client`."""
        return self.wait_for_client().get_pod(*args, **kwargs)

    def get_nad(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`KubeClient.get_nad`, after :meth:`wait_for_client`."""
        return self.wait_for_client().get_nad(*args, **kwargs)

    def set_network_status(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`KubeClient.set_network_status`, after :meth:`wait_for_client`."""
        self.wait_for_client().set_network_status(*args, **kwargs)

    def emit_event(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`KubeClient.emit_event`, after :meth:`wait_for_client`."""
        self.wait_for_client().emit_event(*args, **kwargs)

    def pod_dra_devices(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`KubeClient.pod_dra_devices`, after :meth:`wait_for_client`."""
        return self.wait_for_client().pod_dra_devices(*args, **kwargs)
