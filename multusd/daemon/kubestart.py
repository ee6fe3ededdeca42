"""The daemon's Kubernetes client, built (node name, kubeconfig, watches) on a thread of its own.

Reading the kubeconfig and importing the transport (http.client, ssl, yaml) costs tens of ms,
and a credential plugin user imports the whole ``kubernetes`` package: building the client
before serving would hold up ``/healthz`` and every shim queued on a socket-activated
start. Until it is built the client is not :meth:`BackgroundKube.synced` (``/readyz`` answers 500, as while the first list runs);
a request that needs it waits for it, while status lines, ``/status`` and metrics read
:attr:`BackgroundKube.client` and never wait. A kubeconfig that cannot be loaded stops the
daemon (``failure`` says why), as it did when the client was built before serving.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional

from multusd.config import nodename
from multusd.daemon import log
from multusd.errors import MultusError, TryAgainLater

LOG = logging.getLogger(__name__)


class BackgroundKube:
    """A :class:`~multusd.kube.client.KubeClient` being built; its attributes once it is."""

    BUILD_WAIT = 60.0

    def __init__(self, kubeconfig: str, configured_node_name: str,
                 on_failure: Callable[[], None],
                 on_built: Callable[[], None] = lambda: None, *, pool_size: int = 0) -> None:
        self.kubeconfig = kubeconfig
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

    def synced(self) -> bool:
        return self.client is not None and self.client.synced()

    @property
    def last_error(self) -> Optional[str]:
        if self.client is None:
            return self.failure or "the Kubernetes client is still starting"
        return self.client.last_error

    def stop(self) -> None:
        if self.client is not None:
            self.client.stop()

    def __getattr__(self, name: str) -> Any:
        if not self._built.wait(self.BUILD_WAIT) or self.client is None:
            raise TryAgainLater(f"the Kubernetes client is not available: "
                                f"{self.failure or 'still starting'}")
        return getattr(self.client, name)
