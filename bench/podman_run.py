#!/usr/bin/env python3
"""`podman run` with multusd as the network, against podman on a plain bridge: wall times.

A private podman (tests/podmanlib.py: CNI backend, own storage, no registry, an imported
busybox-static image) runs ``podman run -d -p 127.0.0.1:<port>:8080 ... httpd`` then
``podman rm -f -t 0``, alternating between three networks:

* ``bridge``: podman's own conflist, bridge + host-local + portmap (no multusd);
* ``multus``: a conflist whose one plugin is ``multus-shim`` (the package's launcher); the
  daemon (delegates mode, under systemd-socket-activate) runs the same bridge + portmap;
* ``multus+net1``: the same plus ``defaultNetworks`` adding a second bridge as net1.

Prints one JSON line on stdout (p50/p95 ms of ``run`` and ``rm`` per network, and the multus
overhead at p50) and a table on stderr. Removes everything it made. Needs root.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from harness import DaemonProcess, bridge_conf, del_link  # noqa: E402
from podmanlib import Podman, missing  # noqa: E402
from testlib import PLUGIN_DIR  # noqa: E402


def percentile(samples: list, fraction: float) -> float:
    """Nearest rank."""
    ordered = sorted(samples)
    return round(ordered[max(0, math.ceil(fraction * len(ordered)) - 1)], 1)


def plugins(bridge: str, subnet: str, leases: str) -> list:
    primary = bridge_conf("unused", bridge, subnet, leases, cni_version="0.4.0")
    del primary["name"], primary["cniVersion"]
    return [primary, {"type": "portmap", "capabilities": {"portMappings": True}}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="containers per network")
    args = parser.parse_args()
    reason = missing()
    if reason:
        print(f"podman_run: {reason}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="mdpmb-")
    leases = os.path.join(work, "leases")
    bridges = [f"mdpb{uuid.uuid4().hex[:8]}" for _ in range(3)]
    podman = Podman()
    daemons = []
    try:
        image = podman.import_busybox()
        networks = {"bridge": podman.network("mdpb-bridge",
                                             plugins(bridges[0], "10.158.0.0/24", leases))}
        conf_dir = os.path.join(work, "confdir")
        os.makedirs(conf_dir)
        cluster = os.path.join(conf_dir, "10-primary.conflist")
        with open(cluster, "w") as handle:
            json.dump({"cniVersion": "0.4.0", "name": "primary",
                       "plugins": plugins(bridges[1], "10.159.0.0/24", leases)}, handle)
        with open(os.path.join(conf_dir, "20-extra.conf"), "w") as handle:
            json.dump(bridge_conf("extra", bridges[2], "10.160.0.0/24", leases,
                                  cni_version="0.4.0", gateway=False), handle)
        for label, extra in (("multus", {}), ("multus+net1", {"defaultNetworks": ["extra"]})):
            config = {"cniVersion": "0.4.0", "confDir": conf_dir, "clusterNetwork": cluster,
                      "binDir": PLUGIN_DIR, "logLevel": "verbose", **extra}
            daemon = DaemonProcess(config, workdir=os.path.join(work, label)).start()
            daemons.append(daemon)
            networks[label] = podman.network(f"mdpb-{len(daemons)}", [
                {"type": "multus-shim", "daemonSocketDir": daemon.socket_dir,
                 "capabilities": {"portMappings": True}}])
        times = {label: {"run": [], "rm": []} for label in networks}
        for index in range(args.runs):
            for label, network in networks.items():
                name = f"b{index}-{label.replace('+', '-')}"
                started = time.monotonic()
                podman(*podman.run_args("-d", "--name", name, "--network", network,
                                        "-p", f"127.0.0.1:{18700 + index}:8080", image,
                                        "/bin/busybox", "httpd", "-f", "-p", "8080"))
                middle = time.monotonic()
                podman("rm", "--force", "--time", "0", name)
                ended = time.monotonic()
                times[label]["run"].append((middle - started) * 1000)
                times[label]["rm"].append((ended - middle) * 1000)
    finally:
        podman.cleanup()
        for daemon in daemons:
            daemon.cleanup()
        for bridge in bridges:
            del_link(bridge)
        shutil.rmtree(work, ignore_errors=True)
    figures = {label: {verb: {"p50": percentile(v, 0.5), "p95": percentile(v, 0.95)}
                       for verb, v in verbs.items()} for label, verbs in times.items()}
    base = figures["bridge"]["run"]["p50"]
    summary = {label: round(figures[label]["run"]["p50"] - base, 1)
               for label in ("multus", "multus+net1")}
    print(json.dumps({"runs": args.runs, "ms": figures, "run_overhead_p50_ms": summary}))
    print(f"{'network':<14}{'run p50':>9}{'run p95':>9}{'rm p50':>9}{'rm p95':>9}",
          file=sys.stderr)
    for label, verbs in figures.items():
        print(f"{label:<14}{verbs['run']['p50']:>9}{verbs['run']['p95']:>9}"
              f"{verbs['rm']['p50']:>9}{verbs['rm']['p95']:>9}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
