"""What the shim costs on its own, measured against a stand-in daemon that answers at once.

Wall and CPU ms of the shim (venv, packaged launcher, with site) and of a bare interpreter.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import threading
from typing import Any, Callable, Dict, List

from rig import CNI_VERSION, REPO, SHIM_TIMEOUT, Pod, Scratch, shim  # first: tests/ on the path
from harness import PYTHON, call_shim, shim_conf
from stats import Interrupted, percentiles, timed

from multusd.wire import api


class InstantDaemon:
    """A stand-in for multusd on a unix socket that answers every request at once.

    /readyz and /healthz get 200; /cni gets a fixed ADD result at the wire version, so the
    shim does all its usual work (connect twice, encode, decode, convert the result).
    """

    RESULT = {"Result": {"cniVersion": "1.1.0",
                         "interfaces": [{"name": "eth0", "mac": "0a:58:0a:e7:00:02",
                                         "sandbox": "/var/run/netns/x"}],
                         "ips": [{"address": "10.231.0.2/16", "gateway": "10.231.0.1",
                                  "interface": 0}],
                         "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}}

    def __init__(self, socket_dir: str) -> None:
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        self.socket_dir = socket_dir
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(api.socket_path(socket_dir))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="bench-instant", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        body = json.dumps(self.RESULT).encode()
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    request = self._read_request(conn)
                    payload = body if request.startswith(b"POST /cni") else b""
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                 % (len(payload), payload))
                except OSError:
                    pass

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        return head

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.listener.close()
        try:
            os.unlink(api.socket_path(self.socket_dir))  # so that another can bind it
        except FileNotFoundError:
            pass


def packaged_shim(command: str, conf: dict, *, site: bool = False) -> int:
    """The shim as the packages install it (packaging/multus-shim.launcher: ``python3 -IS``);
    returns its exit code. ``site``: with ``-I`` only, for what the site module costs."""
    launcher = (f"import sys; sys.path.insert(0, {REPO!r}); "
                "from multusd.wire.shim import main; sys.exit(main())")
    flags = "-I" if site else "-IS"
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "CNI_COMMAND": command, "CNI_CONTAINERID": "bench-instant", "CNI_NETNS": "/dev/null",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=instant"}
    proc = subprocess.run([os.path.realpath(PYTHON), flags, "-c", launcher],
                          input=json.dumps(conf).encode(), env=env, capture_output=True,
                          timeout=SHIM_TIMEOUT)
    return proc.returncode


def children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def shim_share(scratch: Scratch, repeats: int, failures: List[str]) -> Dict[str, Any]:
    """What the shim costs on its own (wall and CPU ms), with a daemon that answers at once.

    ``venv_*`` is the shim as this benchmark (harness.call_shim) runs it; ``packaged_*`` as
    the packages install it; ``python_*`` an interpreter that does nothing, for reference.
    """
    instant = InstantDaemon(os.path.join(scratch.workdir, "instant"))
    conf = shim_conf(instant.socket_dir, CNI_VERSION)
    fake_pod = Pod("instant", "bench-instant", "", "/dev/null")
    real_python = os.path.realpath(PYTHON)

    def exit_code(argv: List[str]) -> Callable[[], int]:
        return lambda: subprocess.run(argv, capture_output=True).returncode

    variants: Dict[str, Callable[[], int]] = {
        "python_venv_startup": exit_code([PYTHON, "-c", "pass"]),
        "python_isolated_startup": exit_code([real_python, "-I", "-c", "pass"]),
        "python_isolated_nosite_startup": exit_code([real_python, "-I", "-S", "-c", "pass"]),
        "venv_version": lambda: call_shim("VERSION", conf, timeout=SHIM_TIMEOUT).code,
        "venv_add_instant": lambda: shim("ADD", conf, fake_pod).code,
        "packaged_version": lambda: packaged_shim("VERSION", conf),
        "packaged_add_instant": lambda: packaged_shim("ADD", conf),
        "packaged_del_instant": lambda: packaged_shim("DEL", conf),
        "site_add_instant": lambda: packaged_shim("ADD", conf, site=True),
    }
    try:
        return measure_commands(variants, repeats, scratch, failures, "shim measurement")
    finally:
        instant.close()


def measure_commands(variants: Dict[str, Callable[[], int]], repeats: int, scratch: Scratch,
                     failures: List[str], what: str) -> Dict[str, Any]:
    """Wall and CPU ms (children's) of each command, ``repeats`` rounds of all in turn; a
    non-zero exit code is a failure, left out of the figures."""
    wall: Dict[str, List[float]] = {key: [] for key in variants}
    cpu: Dict[str, List[float]] = {key: [] for key in variants}
    for _ in range(repeats):
        for key, call in variants.items():
            if scratch.stopping.is_set():
                raise Interrupted()
            cpu_before = children_cpu_ms()
            ms, code = timed(call)
            if code != 0:
                failures.append(f"{what} {key}: exit {code}")
                continue
            wall[key].append(ms)
            cpu[key].append(children_cpu_ms() - cpu_before)
    return {key: dict(percentiles(wall[key]), cpu_p50=percentiles(cpu[key]).get("p50"))
            for key in variants}
