"""ADD then DEL through /opt/cni/bin/multus-shim, over and over; run *inside* the container.

Usage: python3 cni_loop.py CONF_JSON NETNS_PATH WORKDIR MAX_ROUNDS
Each call's outcome is appended to WORKDIR/calls.jsonl as it happens (the host counts them to
pace its restarts); the loop ends when WORKDIR/stop exists or after MAX_ROUNDS rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

SHIM = "/opt/cni/bin/multus-shim"


def call(command: str, conf: str, netns: str, container_id: str, pod: str) -> dict:
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
                    f"K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={uuid.uuid4()}",
    }
    done = subprocess.run([SHIM], input=conf, env=env, capture_output=True, text=True,
                          timeout=300)
    return {"command": command, "container": container_id, "rc": done.returncode,
            "stdout": done.stdout[-2000:], "stderr": done.stderr[-2000:]}


def main() -> int:
    conf_path, netns, workdir, max_rounds = sys.argv[1:5]
    with open(conf_path) as f:
        conf = f.read()
    stop = os.path.join(workdir, "stop")
    with open(os.path.join(workdir, "calls.jsonl"), "a") as out:
        for round_no in range(int(max_rounds)):
            if os.path.exists(stop):
                break
            container_id = f"loop{round_no:04d}{uuid.uuid4().hex[:8]}"
            pod = f"loop-{round_no}"
            for command in ("ADD", "DEL"):
                out.write(json.dumps(call(command, conf, netns, container_id, pod)) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
