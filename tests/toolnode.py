"""A node for tools/' own tests: daemon-config.json for stub delegates (``stub-record``, in
tests/stubs), the daemon's Multus on it to write a real cniDir, and what the stubs were asked.

The records are written by the daemon's own ADD and DEL in real network namespaces (the stubs
create no interface, so a fresh namespace will do), then the tools read them as they read a
node's; the tools run in the test's process from the config file, as ``multusd <tool>`` does.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

from harness import STUBS
from multusd.config import daemonconf
from multusd.core import request
from multusd.core.multus import Multus
from stubnode import LOG
from testlib import run

RUNTIME_CONF = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus-shim"}
POD_ARGS = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u1"


class ToolNode:
    """``delegates(node)`` gives the stub delegates; ``daemon`` more daemon-config.json keys."""

    def __init__(self, tmp_path: Any, make_netns: Callable[[], str],
                 delegates: Callable[["ToolNode"], List[Dict[str, Any]]], **daemon: Any) -> None:
        self.make_netns = make_netns
        self.cni_dir = str(tmp_path / "cni")
        self.calls_file = str(tmp_path / "calls.jsonl")
        self.config_path = str(tmp_path / "daemon-config.json")
        os.makedirs(tmp_path / "net.d", exist_ok=True)
        self.conf_dir = str(tmp_path / "net.d")  # 00-multus.conf goes here
        document = {"cniDir": self.cni_dir, "binDir": STUBS, "cniVersion": "1.0.0",
                    "socketDir": str(tmp_path / "run"), "cniConfigDir": self.conf_dir,
                    "multusAutoconfigDir": self.conf_dir, "delegates": delegates(self),
                    **daemon}
        with open(self.config_path, "w") as handle:
            json.dump(document, handle)
        self.config = daemonconf.load(self.config_path)
        self.multus = Multus(self.config)

    def stub(self, name: str, **keys: Any) -> Dict[str, Any]:
        """A ``stub-record`` delegate config named ``name`` (keys: see tests/stubs)."""
        return dict({"cniVersion": "1.0.0", "name": name, "type": "stub-record",
                     "recordFile": self.calls_file}, **keys)

    def request(self, command: str, cid: str, netns: str, args: str = POD_ARGS
                ) -> request.CmdArgs:
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
               "CNI_IFNAME": "eth0", "CNI_ARGS": args}
        return request.parse(env, json.dumps(RUNTIME_CONF).encode(), self.config)

    def attach(self, cid: str, args: str = POD_ARGS, netns: Optional[str] = None) -> str:
        """The daemon's ADD of ``cid`` in a new namespace (or ``netns``); its path."""
        netns = netns or self.make_netns()
        self.multus.cni(self.request("ADD", cid, netns, args), time.monotonic() + 30, LOG)
        return netns

    def delete(self, cid: str, netns: str, args: str = POD_ARGS) -> None:
        """The daemon's DEL of ``cid`` (raises what it raises)."""
        self.multus.cni(self.request("DEL", cid, netns, args), time.monotonic() + 30, LOG)

    def files(self) -> List[str]:
        """Every file under cniDir, relative to it."""
        found = []
        for directory, _, names in os.walk(self.cni_dir):
            found += [os.path.relpath(os.path.join(directory, n), self.cni_dir) for n in names]
        return sorted(found)

    def calls(self) -> List[tuple]:
        """(command, network name, env) of every stub ADD and DEL, in order."""
        if not os.path.exists(self.calls_file):
            return []
        with open(self.calls_file) as handle:
            lines = [json.loads(line) for line in handle]
        return [(c["command"], c["stdin"]["name"], c["env"]) for c in lines
                if c["command"] in ("DEL", "ADD")]

    def del_calls(self) -> List[tuple]:
        """(network name, env) of every stub DEL."""
        return [(name, env) for command, name, env in self.calls() if command == "DEL"]


def netns_gone(netns: str) -> None:
    """``ip netns del``: the sandbox's namespace is gone, its records stay."""
    run("ip", "netns", "del", os.path.basename(netns))
