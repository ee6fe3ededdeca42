"""Helpers shared by the tests (import them from here, not from conftest: pytest may load
several conftest modules under that one name)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
import uuid
from typing import Callable

PLUGIN_DIR = "/usr/lib/cni"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_for(condition: Callable[[], object], timeout: float = 10.0,
             interval: float = 0.01, what: str = "condition") -> object:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def unique(prefix: str) -> str:
    """A short unique name (fits the 15-character interface name limit for short prefixes)."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kw)


def netns_links(netns_path: str) -> dict:
    """Interfaces inside a namespace: name -> list of 'addr/prefix' strings (via ip -j)."""
    name = os.path.basename(netns_path)
    out = run("ip", "-n", name, "-j", "addr", "show").stdout
    return {link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])]
            for link in json.loads(out)}


def netns_routes(netns_path: str, family: str = "-4") -> list:
    name = os.path.basename(netns_path)
    return json.loads(run("ip", family, "-n", name, "-j", "route", "show").stdout)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name{labels}`` (every label, in any order) in a /metrics text,
    read with prometheus_client's own parser so that a malformed exposition fails; None
    when there is no such sample."""
    from prometheus_client.parser import text_string_to_metric_families

    found = [sample.value for family in text_string_to_metric_families(text)
             for sample in family.samples if sample.name == name and sample.labels == labels]
    assert len(found) <= 1, f"{name}{labels} appears {len(found)} times"
    return found[0] if found else None

def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def raw_exchange(path: str, data: bytes, half_close: bool = False) -> bytes:
    """Send raw bytes to a unix socket, read the answer to EOF (``half_close``: SHUT_WR first)."""
    import socket as pysocket

    with pysocket.socket(pysocket.AF_UNIX) as conn:
        conn.settimeout(30)
        conn.connect(path)
        try:
            conn.sendall(data)
            if half_close:
                conn.shutdown(pysocket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before it read everything: read what it said
        received = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk


_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_SLAVE = 0x00020000, 0x1000, 0x4000, 1 << 19


def bind_in_private_mounts(source: str, target: str) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets a mount namespace of its own (slave to the host's)
    with ``source`` bound on ``target``; the host sees nothing of it. For upstream's daemon,
    whose in-cluster config reads fixed paths under /run/secrets."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    source_b, target_b = source.encode(), target.encode()

    def preexec() -> None:  # in the child, before exec
        if libc.unshare(_CLONE_NEWNS) != 0:
            os._exit(120)
        if libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
            os._exit(121)
        if libc.mount(source_b, target_b, None, _MS_BIND, None) != 0:
            os._exit(122)
    return preexec


def token_kubeconfig(path, token: str, **cluster: object) -> str:
    """Write at ``path`` a kubeconfig whose one context reaches ``cluster`` (``server=`` and
    any other cluster field) with a bearer ``token``; returns the path."""
    document = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    with open(path, "w") as handle:
        json.dump(document, handle)
    return str(path)


def random_json(rng: random.Random, depth: int, floats: bool = True) -> str:
    """A random JSON text up to ``depth`` levels: keys that differ only in case, lone
    surrogate escapes, non-ASCII, floats in several spellings (``floats=False``: integers only)."""
    kind = rng.randrange(9 if depth else 6)
    if kind == 0:
        return rng.choice(["true", "false", "null"])
    if kind == 1:
        return str(rng.randrange(-10 ** 6, 10 ** 6))
    if kind == 2:
        return rng.choice(["1e2", "0.5", "-1.25e-7", "3.0", "1E+3"]) if floats else "7"
    if kind in (3, 4, 5):
        chars = ["a", "B", "\\n", "\\ud800", "\\u00e9", "é", " ", "\\\"", "\\\\", "ſ"]
        return '"' + "".join(rng.choice(chars) for _ in range(rng.randrange(6))) + '"'
    if kind in (6, 7):
        members = [f'"{rng.choice("aAbB")}": {random_json(rng, depth - 1, floats)}'
                   for _ in range(rng.randrange(4))]
        return "{" + ", ".join(members) + "}"
    return "[" + ",".join(random_json(rng, depth - 1, floats)
                          for _ in range(rng.randrange(4))) + "]"
