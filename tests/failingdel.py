"""A sandbox whose DEL failed, for the tests of its marks: the runtime's DEL request, what
failed, and the sandbox's records (core/delmarks, markadoption, unreleased, unreleasedwarning)."""

from __future__ import annotations

import os

from multusd import store
from multusd.config import daemonconf
from multusd.core import request
from multusd.core.delmarks import Failure

CONF = b'{"cniVersion":"0.4.0","name":"multus-cni-network","type":"multus-shim"}'
FAILED = (Failure(network="default/vendor", ifname="net1", error="plugin gone"),)
BOOT = "3d0f7a52-0000-4000-8000-000000000001"


def del_request(cni_dir: str, cid: str = "c0ffee", uid: str = "u-1") -> request.CmdArgs:
    """The runtime's DEL of sandbox ``cid`` of pod default/web."""
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": "/run/netns/x",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin", "PATH": "/usr/bin",
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;"
                       f"K8S_POD_UID={uid}"}
    return request.parse(env, CONF, daemonconf.from_dict({"cniDir": cni_dir}))


def write_records(cni_dir: str, cid: str) -> None:
    """A scratch cache for ``cid`` (what DEL would release)."""
    store.atomic_write(os.path.join(cni_dir, cid), b"[]")
