"""Which node multusd serves: its name and where that name came from (the first that applies).

1. ``nodeName`` in daemon-config.json;
2. the ``MULTUS_NODE_NAME`` environment variable (upstream's contract; on a host, a drop-in
   for multusd.service with ``Environment=MULTUS_NODE_NAME=<name>``);
3. the node's own identity in the kubeconfig: a kubelet client certificate's subject
   ``CN=system:node:<name>`` (/etc/kubernetes/kubelet.conf and the kubelet's rotated
   certificate are of this kind);
4. the host name, lowercased as the kubelet does.

The pod watch selects ``spec.nodeName=<name>``: a wrong name leaves the cache empty and costs
every ADD a live GET, which the Kubernetes client detects and reports.
"""

from __future__ import annotations

import socket
from typing import Callable, Mapping, Optional

from multusd.store.valueclass import Record

ENV_VAR = "MULTUS_NODE_NAME"


class NodeName(Record):
    """A node name and its source, as the start-up log line and the status line show them."""

    name: str
    source: str

    def describe(self) -> str:
        return f'node name "{self.name}" from {self.source}'


def resolve(configured: str, environ: Mapping[str, str],
            certificate_identity: Optional[Callable[[], Optional[str]]] = None,
            hostname: Callable[[], str] = socket.gethostname) -> NodeName:
    """The first of the four sources above that gives a non-empty name.

    :param configured: the ``nodeName`` key ("" when absent).
    :param certificate_identity: reads the kubeconfig's client certificate (only called when
        neither the key nor the variable is set); None without a kubeconfig.
    """
    if configured.strip():
        return NodeName(configured.strip(), "nodeName in daemon-config.json")
    value = (environ.get(ENV_VAR) or "").strip()
    if value:
        return NodeName(value, ENV_VAR)
    if certificate_identity is not None:
        identity = certificate_identity()
        if identity:
            return NodeName(identity, "the kubeconfig's client certificate (CN=system:node:...)")
    # kubelet: strings.ToLower(strings.TrimSpace(hostname)) unless --hostname-override
    return NodeName(hostname().strip().lower(), "the host name (lowercased as kubelet does)")
