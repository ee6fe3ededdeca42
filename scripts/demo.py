#!/usr/bin/env python3
"""`make run`: multusd end to end on an embedded default config, then clean up.

Starts the daemon through the real socket-activation protocol (systemd-socket-activate),
creates a pod network namespace, calls the real multus-shim exactly as a container runtime
does (CNI_* env, 00-multus.conf on stdin), prints the result and the pod's interfaces,
runs DEL, and removes everything it made (namespace, bridges, leases, files, process).

``--k8s`` (``make run ARGS=--k8s``) does the same the Kubernetes way: a local stand-in API
server (tests/kubeapi.py) holds two NetworkAttachmentDefinitions and a pod whose
``k8s.v1.cni.cncf.io/networks`` annotation asks for both; the pod gets eth0, net1 and net2,
and the network-status annotation multusd wrote on it is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from harness import (DaemonProcess, bridge_conf, call_shim, del_link, del_netns,  # noqa: E402
                     netns_addresses, new_netns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s", action="store_true",
                        help="networks from NetworkAttachmentDefinitions on a stand-in API server")
    options = parser.parse_args()
    if os.geteuid() != 0:
        print("make run needs root: it creates a network namespace and bridges", file=sys.stderr)
        return 1
    tag = uuid.uuid4().hex[:6]
    bridges = [f"mdemo0-{tag}", f"mdemo1-{tag}", f"mdemo2-{tag}"]
    daemon = DaemonProcess({"cniVersion": "0.3.1", "logLevel": "verbose"})
    leases = os.path.join(daemon.workdir, "leases")
    cluster_net = bridge_conf("cluster-net", bridges[0], "10.244.7.0/24", leases)
    secondary = [bridge_conf("storage-net", bridges[1], "10.245.7.0/24", leases, gateway=False),
                 bridge_conf("backup-net", bridges[2], "10.246.7.0/24", leases, gateway=False)]
    kube = None
    uid = str(uuid.uuid4())
    if options.k8s:
        kube = start_api_server(daemon, cluster_net, secondary, uid)
    else:
        daemon.config["delegates"] = [cluster_net, secondary[0]]
    with open(daemon.config_path, "w") as handle:
        json.dump(daemon.config, handle)
    netns_name, netns_path = new_netns()
    container_id = f"demo{tag}"
    status = 1
    try:
        daemon.start(activate=False)
        print(f"multusd listening on {daemon.socket_path} (socket-activated, starts on first use)")
        add = call_shim("ADD", daemon.shim_conf(), container_id=container_id, netns=netns_path,
                        pod=("default", "demo-pod"), uid=uid)
        print(f"\nshim ADD exit code {add.code}; result as the runtime sees it:")
        print(json.dumps(add.output, indent=2))
        print(f"\ninterfaces in the pod's network namespace {netns_name}:")
        for ifname, addresses in netns_addresses(netns_name).items():
            print(f"  {ifname:6} {' '.join(addresses)}")
        if kube is not None:
            pod = kube.pod("default", "demo-pod")
            print("\nthe pod's k8s.v1.cni.cncf.io/network-status annotation, written by multusd:")
            print(pod["metadata"]["annotations"].get("k8s.v1.cni.cncf.io/network-status"))
        delete = call_shim("DEL", daemon.shim_conf(), container_id=container_id,
                           netns=netns_path, pod=("default", "demo-pod"))
        print(f"\nshim DEL exit code {delete.code}; interfaces left in the pod: "
              f"{sorted(netns_addresses(netns_name))}")
        status = 0 if add.code == 0 and delete.code == 0 else 1
        if status:
            print("\n--- multusd log ---\n" + daemon.log(), file=sys.stderr)
    finally:
        daemon.cleanup()
        if kube is not None:
            kube.stop()
        del_netns(netns_name)
        for bridge in bridges:
            del_link(bridge)
    print("\ncleaned up: daemon stopped, namespace, bridges, leases and files removed")
    return status


def start_api_server(daemon: DaemonProcess, cluster_net: dict, secondary: list, uid: str):
    """The stand-in API server with two NADs and an annotated pod; points the daemon at it."""
    from kubeapi import FakeKubeAPI

    kube = FakeKubeAPI(tempfile.mkdtemp(prefix="kubeapi-", dir=daemon.workdir)).start()
    for conf in secondary:
        spec = {k: v for k, v in conf.items() if k != "name"}
        kube.add_nad("default", conf["name"], json.dumps(spec))
    kube.add_pod("default", "demo-pod", uid=uid, annotations={
        "k8s.v1.cni.cncf.io/networks": ",".join(conf["name"] for conf in secondary)})
    cluster_path = os.path.join(daemon.workdir, "10-cluster-net.conf")
    with open(cluster_path, "w") as handle:
        json.dump(cluster_net, handle)
    daemon.config.update({"kubeconfig": kube.kubeconfig_path, "nodeName": kube.node,
                          "clusterNetwork": cluster_path})
    print(f"stand-in Kubernetes API on {kube.url}: NADs storage-net, backup-net; pod "
          "default/demo-pod asks for both")
    return kube


if __name__ == "__main__":
    sys.exit(main())
