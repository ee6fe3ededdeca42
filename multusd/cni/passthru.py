"""passthru: the no-op CNI plugin at the head of an auxiliaryCNIChainName chain (F56).

Standard library and the versions of :mod:`multusd` only. ADD prints an empty, valid result at
the config's cniVersion (the chained plugins that follow, e.g. tuning, then act on the pod's
interfaces); DEL and CHECK do nothing; VERSION lists what it speaks. Installed as
/opt/cni/bin/passthru.
"""

from __future__ import annotations

import json
import os
import sys

from multusd import CURRENT_VERSION, SUPPORTED_VERSIONS, go_field, go_loads


def run(command: str, stdin: bytes) -> tuple:
    """(exit code, JSON to print or None) for one call."""
    try:
        conf = go_loads(stdin) if stdin.strip() else {}  # as upstream's Go passthru reads it
        version = str(go_field(conf, "cniVersion") or CURRENT_VERSION) \
            if isinstance(conf, dict) else ""
        if not version:
            raise ValueError("the configuration is not a JSON object")
    except ValueError as exc:
        return 1, {"cniVersion": CURRENT_VERSION, "code": 6,
                   "msg": f"passthru cni: error parsing CNI configuration: {exc}", "details": ""}
    if command == "VERSION":
        return 0, {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}
    if command == "ADD":
        result = {"cniVersion": version, "interfaces": [], "ips": [], "routes": [], "dns": {}}
        if version.startswith("1."):
            del result["dns"]
        return 0, result
    return 0, None


def main() -> int:
    code, output = run(os.environ.get("CNI_COMMAND", ""), sys.stdin.buffer.read())
    if output is not None:
        print(json.dumps(output))
    return code


if __name__ == "__main__":
    sys.exit(main())
