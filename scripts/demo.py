#!/usr/bin/env python3
"""`make run`: multusd end to end on an embedded default config, then clean up.

Starts the daemon through the real socket-activation protocol (systemd-socket-activate),
creates a pod network namespace, calls the real multus-shim exactly as a container runtime
does (CNI_* env, 00-multus.conf on stdin), prints the result and the pod's interfaces,
runs DEL, and removes everything it made (namespace, bridges, leases, files, process).
"""

from __future__ import annotations

import json
import os
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from harness import (DaemonProcess, bridge_conf, call_shim, del_link, del_netns,  # noqa: E402
                     netns_addresses, new_netns)


def main() -> int:
    if os.geteuid() != 0:
        print("make run needs root: it creates a network namespace and bridges", file=sys.stderr)
        return 1
    tag = uuid.uuid4().hex[:6]
    bridges = [f"mdemo0-{tag}", f"mdemo1-{tag}"]
    daemon = DaemonProcess({"cniVersion": "0.3.1", "logLevel": "verbose"})
    leases = os.path.join(daemon.workdir, "leases")
    daemon.config["delegates"] = [
        bridge_conf("cluster-net", bridges[0], "10.244.7.0/24", leases),
        bridge_conf("storage-net", bridges[1], "10.245.7.0/24", leases, gateway=False),
    ]
    with open(daemon.config_path, "w") as handle:
        json.dump(daemon.config, handle)
    netns_name, netns_path = new_netns()
    container_id = f"demo{tag}"
    status = 1
    try:
        daemon.start(activate=False)
        print(f"multusd listening on {daemon.socket_path} (socket-activated, starts on first use)")
        add = call_shim("ADD", daemon.shim_conf(), container_id=container_id, netns=netns_path,
                        pod=("default", "demo-pod"), uid=str(uuid.uuid4()))
        print(f"\nshim ADD exit code {add.code}; result as the runtime sees it:")
        print(json.dumps(add.output, indent=2))
        print(f"\ninterfaces in the pod's network namespace {netns_name}:")
        for ifname, addresses in netns_addresses(netns_name).items():
            print(f"  {ifname:6} {' '.join(addresses)}")
        delete = call_shim("DEL", daemon.shim_conf(), container_id=container_id,
                           netns=netns_path, pod=("default", "demo-pod"))
        print(f"\nshim DEL exit code {delete.code}; interfaces left in the pod: "
              f"{sorted(netns_addresses(netns_name))}")
        status = 0 if add.code == 0 and delete.code == 0 else 1
        if status:
            print("\n--- multusd log ---\n" + daemon.log(), file=sys.stderr)
    finally:
        daemon.cleanup()
        del_netns(netns_name)
        for bridge in bridges:
            del_link(bridge)
    print("\ncleaned up: daemon stopped, namespace, bridges, leases and files removed")
    return status


if __name__ == "__main__":
    sys.exit(main())
