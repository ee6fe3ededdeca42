"""What core/'s resolution tests share: config files written for real under tmp_path, and NADs
behind the NadGetter seam (the only stand-in: Kubernetes itself)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

BRIDGE = {"cniVersion": "0.3.1", "name": "cbr0", "type": "bridge", "bridge": "cni0",
          "ipam": {"type": "host-local", "subnet": "10.10.0.0/24", "dataDir": "/x"}}
MACVLAN = ('{"cniVersion":"0.3.1","name":"net1","type":"macvlan","master":"dummy0",'
           '"capabilities":{"mac":true}}')


@dataclass
class Nad:
    """A NetworkAttachmentDefinition as the Kubernetes client hands it over."""

    namespace: str
    name: str
    config: str
    annotations: Dict[str, str] = field(default_factory=dict)


class Nads:
    """The NadGetter seam: NADs by (namespace, name); records every lookup."""

    def __init__(self, *nads: Nad) -> None:
        self.nads = {(n.namespace, n.name): n for n in nads}
        self.lookups: list = []

    def __call__(self, namespace: str, name: str) -> Optional[Nad]:
        self.lookups.append((namespace, name))
        return self.nads.get((namespace, name))


def write(path: Any, data: Any) -> str:
    """``data`` (a string as it is, anything else as JSON) into ``path``, its directory made."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(str(path), "w") as handle:
        handle.write(data if isinstance(data, str) else json.dumps(data))
    return str(path)
