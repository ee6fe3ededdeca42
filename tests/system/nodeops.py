"""What the booted-systemd tests share: the node's paths, the configs, the shim call, unit state."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import Dict, List, Optional

from machine import Machine
from testlib import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
SOCKET = "/run/multus/multus.sock"
CONFIG = "/etc/cni/net.d/multus.d/daemon-config.json"
GENERATED = "/etc/cni/net.d/00-multus.conf"
PRIMARY_PATH = "/etc/cni/net.d/10-mdtest.conflist"
WORK = "/var/tmp/mdtest"  # on the container's disk, so the host reads it through the root dir
UNITS = ("multusd.socket", "multusd.service", "multusd-socket-guard.path",
         "multusd-socket-guard.service", "multusd-config.path", "multusd-config.timer",
         "multusd-config.service")

# The operator's edit of the conffile: no kubeconfig (delegates mode), no binDir: the plugins
# are found in Debian's /usr/lib/cni (containernetworking-plugins, which the package recommends).
EDITED_CONFIG = {
    "cniVersion": "0.3.1",
    "logLevel": "debug",
    "logToStderr": True,
    "cniConfigDir": "/etc/cni/net.d",
    "multusAutoconfigDir": "/etc/cni/net.d",
    "multusConfigFile": "auto",
    "socketDir": "/run/multus/",
}
PRIMARY = {
    "cniVersion": "0.3.1", "name": "mdtest-primary",
    "plugins": [{"type": "bridge", "bridge": "mdprim0", "isGateway": True,
                 "ipam": {"type": "host-local", "subnet": "10.88.0.0/24",
                          "dataDir": f"{WORK}/ipam-primary"}}],
}
# What a runtime would hand the shim: delegates mode, one bridge + host-local network.
SHIM_CONF = {
    "cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus-shim",
    "daemonSocketDir": "/run/multus",
    "delegates": [{"cniVersion": "0.3.1", "name": "mdtest", "type": "bridge",
                   "bridge": "mdbr0", "isGateway": True,
                   "ipam": {"type": "host-local", "subnet": "10.89.0.0/24",
                            "dataDir": f"{WORK}/ipam"}}],
}


def shim_env(command: str, container_id: str, pod: str, netns: str,
             uid: Optional[str] = None) -> Dict[str, str]:
    """The environment a runtime gives the shim for one call (a pod of namespace default)."""
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
                        f"K8S_POD_INFRA_CONTAINER_ID={container_id};"
                        f"K8S_POD_UID={uid or uuid.uuid4()}"}


def shim(box: Machine, command: str, container_id: str, pod: str, netns: str, *,
         conf: Optional[dict] = None, uid: Optional[str] = None) -> subprocess.CompletedProcess:
    """``multus-shim`` as the runtime calls it, with SHIM_CONF (or ``conf``) on its stdin."""
    return box.run("/opt/cni/bin/multus-shim",
                   env=shim_env(command, container_id, pod, netns, uid),
                   input=json.dumps(SHIM_CONF if conf is None else conf), check=False,
                   timeout=300)


def active_state(box: Machine, unit: str) -> str:
    return box.run("systemctl", "is-active", unit, check=False).stdout.strip()


def show(box: Machine, unit: str, prop: str) -> str:
    return box.run("systemctl", "show", unit, "-p", prop, "--value").stdout.strip()


def netns_addrs(box: Machine, name: str) -> Dict[str, List[str]]:
    out = box.run("ip", "-n", name, "-j", "addr", "show").stdout
    return {link["ifname"]: [a["local"] for a in link.get("addr_info", [])]
            for link in json.loads(out)}


def configure(box: Machine) -> None:
    """The operator's config and a primary network; waits for the generated 00-multus.conf."""
    box.put(CONFIG, json.dumps(EDITED_CONFIG, indent=4) + "\n")
    box.put(PRIMARY_PATH, json.dumps(PRIMARY, indent=4) + "\n")
    wait_for(lambda: os.path.exists(box.path(GENERATED)), 60, what=GENERATED)
