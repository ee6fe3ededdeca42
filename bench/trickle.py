"""An ADD whose pod read trickles: how long it takes, and another pod's ADD meanwhile.

    .venv/bin/python bench/trickle.py [--rounds 3] [--short 5]   (root: real namespaces)

The stand-in API server (tests/kubeapi.py) answers the live GET of a pod that is not in the
daemon's cache (a pod of another node) with its status line after a second, then one byte
every half second: whole after minutes. The daemon (the packaged launcher, under
systemd-socket-activate) runs with the default requestTimeout and with ``--short`` seconds; for
each, ``--rounds`` ADDs of such a pod through the packaged shim, each with an ADD of a pod
from the cache started once the trickle has begun. Prints one JSON line: per setting, the
trickled ADD's seconds, its CNI error code and msg, the cached ADD's ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

from rig import NAMESPACE, Pod, Scratch, daemon_config, shim, start_kube_api, wait_ready
from stats import machine, percentiles


def pod(scratch: Scratch, kube_api, name: str, node: Optional[str] = None) -> Pod:
    netns_name, netns_path = scratch.netns()
    made = Pod(name, uuid.uuid4().hex, netns_name, netns_path)
    made.uid = kube_api.add_pod(NAMESPACE, name, node=node)["metadata"]["uid"]
    return made


def one_setting(scratch: Scratch, kube_api, request_timeout: Optional[float],
                rounds: int) -> Dict[str, Any]:
    config = daemon_config(scratch, kube_api, "error")
    if request_timeout is not None:
        config["requestTimeout"] = request_timeout
    cached = [pod(scratch, kube_api, f"cached-{len(scratch.daemons)}-{i}") for i in range(rounds)]
    daemon = scratch.daemon(config, f"d{len(scratch.daemons)}").start()
    wait_ready(daemon)
    conf = daemon.shim_conf()
    slow_seconds: List[float] = []
    cached_ms: List[float] = []
    errors: List[Dict[str, Any]] = []
    for index in range(rounds):
        slow = pod(scratch, kube_api, f"slow-{len(scratch.daemons)}-{index}", node="node-b")
        kube_api.trickle("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{slow.name}",
                         seconds=3600)
        begun = kube_api.trickles_begun
        result: Dict[str, Any] = {}

        def add_slow() -> None:
            started = time.monotonic()
            result["out"] = shim("ADD", conf, slow)
            result["seconds"] = time.monotonic() - started

        thread = threading.Thread(target=add_slow)
        thread.start()
        kube_api.wait_trickling(begun + 1, 60)
        started = time.monotonic()
        fast = shim("ADD", conf, cached[index])
        cached_ms.append((time.monotonic() - started) * 1000 if fast.code == 0 else -1)
        thread.join(300)
        slow_seconds.append(round(result["seconds"], 2))
        output = result["out"].output if isinstance(result["out"].output, dict) else {}
        errors.append({"exit": result["out"].code, "code": output.get("code"),
                       "msg": output.get("msg")})
        kube_api.clear_failures()
        for done in (slow, cached[index]):
            shim("DEL", conf, done)
    daemon.terminate()
    return {"requestTimeout": request_timeout if request_timeout is not None else "default",
            "trickled_add_s": slow_seconds, "cached_add_ms": percentiles(cached_ms),
            "errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--short", type=float, default=5.0, help="the short requestTimeout")
    options = parser.parse_args()
    scratch = Scratch()
    try:
        kube_api = start_kube_api(scratch)
        report = {"machine": machine(),
                  "settings": [one_setting(scratch, kube_api, None, options.rounds),
                               one_setting(scratch, kube_api, options.short, options.rounds)]}
    finally:
        scratch.cleanup()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
