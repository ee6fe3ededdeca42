"""A node for core/'s own tests: a private cniDir, delegates that are the stub plugin
``stub-record`` (tests/stubs), the daemon's Multus on them, and what the stubs were asked.

The stubs answer from their own config and write one line per call (command, CNI_IFNAME,
CNI_NETNS, the config they got), so a test reads exactly which delegate got which command
in which order; they create no interface, so any namespace (or none, for DEL) will do.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, List, Optional

from harness import STUBS
from multusd.config import daemonconf
from multusd.core import request
from multusd.core.multus import Multus

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})
RUNTIME_CONF = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus-shim"}
POD_ARGS = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u1"


def stub_calls(calls_file: str) -> List[tuple]:
    """(command, network name, CNI_IFNAME) of every call the stub plugins logged to
    ``calls_file``, in order, VERSION left out."""
    if not os.path.exists(calls_file):
        return []
    with open(calls_file) as handle:
        lines = [json.loads(line) for line in handle]
    return [(c["command"], c["stdin"]["name"], c["env"].get("CNI_IFNAME", ""))
            for c in lines if c["command"] != "VERSION"]


class StubNode:
    """``delegates`` (stub configs from :meth:`stub`) as the daemon's ``delegates`` list."""

    def __init__(self, tmp_path: Any) -> None:
        self.cni_dir = str(tmp_path / "cni")
        self.socket_dir = str(tmp_path / "run")  # the spare marks go beside it, never /run's
        self.calls_file = str(tmp_path / "calls.jsonl")
        self.config: Optional[daemonconf.DaemonConfig] = None
        self.multus: Optional[Multus] = None

    def stub(self, name: str, **keys: Any) -> Dict[str, Any]:
        """A ``stub-record`` delegate config named ``name`` (keys: see tests/stubs)."""
        return dict({"cniVersion": "1.0.0", "name": name, "type": "stub-record",
                     "recordFile": self.calls_file}, **keys)

    def configure(self, delegates: List[Dict[str, Any]], **daemon: Any) -> "StubNode":
        self.config = daemonconf.from_dict(dict({"cniDir": self.cni_dir, "binDir": STUBS,
                                                 "socketDir": self.socket_dir,
                                                 "delegates": delegates}, **daemon))
        self.multus = Multus(self.config)
        return self

    def request(self, command: str, cid: str = "c1", netns: str = "", ifname: str = "eth0",
                args: str = POD_ARGS, **conf: Any) -> request.CmdArgs:
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
               "CNI_IFNAME": ifname, "CNI_ARGS": args}
        return request.parse(env, json.dumps(dict(RUNTIME_CONF, **conf)).encode(),
                             self.config)

    def run(self, command: str, *args: Any, **kw: Any) -> Any:
        """One request through :meth:`Multus.cni`, with the deadline a daemon would give."""
        return self.multus.cni(self.request(command, *args, **kw), time.monotonic() + 30, LOG)

    def calls(self) -> List[tuple]:
        """(command, network name, CNI_IFNAME) of every stub call, in order."""
        return stub_calls(self.calls_file)

    def call_env(self, index: int) -> Dict[str, str]:
        with open(self.calls_file) as handle:
            return json.loads(handle.readlines()[index])["env"]

    def records(self, cid: str = "c1") -> List[str]:
        """The sandbox's files in cniDir: its scratch cache and result-cache entries."""
        found = [cid] if os.path.exists(os.path.join(self.cni_dir, cid)) else []
        results = os.path.join(self.cni_dir, "results")
        if os.path.isdir(results):
            found += sorted(f"results/{n}" for n in os.listdir(results) if f"-{cid}-" in n)
        return found
