"""The stand-in API server (tests/kubeapi.py) as a process; run *inside* the booted container.

Usage: python3 kubestandin.py WORKDIR OBJECTS_JSON
WORKDIR holds tests/kube*.py (copied in by the test). OBJECTS_JSON names the node, the
NetworkAttachmentDefinitions ({"namespace", "name", "config"}) and the pods ({"namespace",
"name", "uid", "annotations"}) to serve. Once listening it writes WORKDIR/kubeconfig and then
WORKDIR/ready ({"url", "token"}); it serves until its stdin is closed. The container's private
network keeps it out of the host's reach, hence inside.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    workdir, objects_path = sys.argv[1:3]
    sys.path.insert(0, workdir)
    from kubeapi import FakeKubeAPI

    with open(objects_path) as handle:
        objects = json.load(handle)
    api = FakeKubeAPI(workdir, node=objects["node"])
    for nad in objects.get("nads", []):
        api.add_nad(nad["namespace"], nad["name"], nad["config"])
    for pod in objects.get("pods", []):
        api.add_pod(pod["namespace"], pod["name"], pod["uid"],
                    annotations=pod.get("annotations", {}))
    api.start()
    ready = os.path.join(workdir, "ready")
    with open(ready + ".tmp", "w") as handle:
        json.dump({"url": api.url, "token": api.token}, handle)
    os.replace(ready + ".tmp", ready)
    try:
        sys.stdin.read()  # until the test closes it (or goes away)
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
