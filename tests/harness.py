"""Real multusd processes for tests, the demo and the benchmark.

:class:`DaemonProcess` starts ``multusd serve`` under ``systemd-socket-activate`` (the real
socket-activation protocol: LISTEN_FDS, a socket multusd did not create) with a config in
a private directory; :func:`call_shim` runs the real ``multus-shim`` exactly as a container
runtime does (CNI_* env, config on stdin) and returns its exit code and JSON output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from testlib import PLUGIN_DIR, wait_for

PYTHON = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The shim as packaging/multus-shim.launcher runs it: python3 -IS, the code's directory on the
# path (here the repository instead of /usr/lib/multusd): no site, no venv, stdlib only.
SHIM_ARGV = [os.path.realpath(PYTHON), "-IS", "-c",
             f"import sys; sys.path.insert(0, {REPO!r}); from multusd.wire.shim import main; "
             "sys.exit(main())"]


def launcher_argv(name: str) -> list[str]:
    """``packaging/<name>.launcher`` run as the package installs it (its #! line: the system's
    python3 -IS, the distribution's package directories), its code path pointed at this tree:
    ``multusd`` (the daemon and the tools) or ``multus-shim``."""
    with open(os.path.join(REPO, "packaging", f"{name}.launcher")) as handle:
        shebang, text = handle.readline(), handle.read()
    return shebang[2:].split() + ["-c", text.replace('"/usr/lib/multusd"', repr(REPO))]


class NotifyListener:
    """A NOTIFY_SOCKET for a daemon under test: the sd_notify messages it sent, in order."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[str] = []
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(path)

    def receive_until(self, text: str, timeout: float = 20.0) -> str:
        """Read messages until one contains ``text`` (AssertionError after ``timeout`` s);
        the latest message that does."""
        deadline = time.monotonic() + timeout
        while not any(text in m for m in self.messages):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {text!r} from sd_notify in {self.messages[-5:]}"
            self._socket.settimeout(remaining)
            try:
                self.messages.append(self._socket.recv(4096).decode())
            except socket.timeout:
                pass
        return next(m for m in reversed(self.messages) if text in m)

    def close(self) -> None:
        self._socket.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "NotifyListener":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_log(path: str) -> str:
    """A daemon's log file so far ("" before it exists)."""
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def bridge_conf(name: str, bridge: str, subnet: str, data_dir: str,
                cni_version: str = "0.3.1", gateway: bool = True) -> dict:
    """A bridge + host-local network whose leases live in ``data_dir``."""
    return {"cniVersion": cni_version, "name": name, "type": "bridge", "bridge": bridge,
            "isGateway": gateway, "ipMasq": False,
            "ipam": {"type": "host-local", "subnet": subnet, "dataDir": data_dir,
                     "routes": [{"dst": "0.0.0.0/0"}] if gateway else []}}


def shim_conf(socket_dir: str, cni_version: str = "0.3.1", **extra: Any) -> dict:
    """What the generated 00-multus.conf gives the shim."""
    conf = {"cniVersion": cni_version, "name": "multus-cni-network", "type": "multus-shim",
            "daemonSocketDir": socket_dir}
    conf.update(extra)
    return conf


@dataclass
class ShimOutput:
    code: int
    output: Any
    stderr: str


def start_bound() -> float:
    """The longest a starting daemon may take to answer (socket activation, its imports, its
    Kubernetes caches): as long as the shim waits for its /readyz."""
    from multusd.wire import shim

    return shim.READY_TIMEOUT


def watch_bound() -> float:
    """The longest a daemon's (or a KubeClient's) watch caches take to hold what the API server
    holds now, whatever they were doing (a watch open, or failing while the server was away):
    one wait of their backoff at its longest (kube.retries.API_SERVER: each wait in [d, 2d),
    d at most its cap), then a list as long as a start's (:func:`start_bound`)."""
    from multusd.kube.retries import API_SERVER

    return API_SERVER.cap * (1 + API_SERVER.jitter) + start_bound()


def reconcile_bound() -> float:
    """The longest a daemon with ``enableDynamicNetworks`` takes to act on a pod's change: its
    watch delivers it (:func:`watch_bound`), then the reconciliation runs in the sandbox's lane
    within a request's deadline (the daemon's requestTimeout: the shim's REQUEST_TIMEOUT unless
    the test configures another)."""
    from multusd.wire import shim

    return watch_bound() + shim.REQUEST_TIMEOUT


def events_bound(count: int = 1, request_timeout: float | None = None) -> float:
    """The longest ``count`` pod events queued by a daemon (or a KubeClient) take to reach the
    API server: they are sent one at a time, each a request of its Kubernetes client, bounded
    by that client's request timeout (by default the daemon's: KubeClient's default)."""
    import inspect

    from multusd.kube.client import KubeClient

    if request_timeout is None:
        request_timeout = inspect.signature(KubeClient).parameters["request_timeout"].default
    return count * request_timeout


def unit_stop_timeout() -> float:
    """TimeoutStopSec= of the packaged multusd.service: when systemd SIGKILLs a stop (the
    longest a stop may take)."""
    with open(os.path.join(REPO, "systemd", "multusd.service")) as handle:
        return float(re.search(r"^TimeoutStopSec=(\d+)$", handle.read(), re.M).group(1))


def shim_bound(command: str) -> float:
    """The longest the real shim takes for ``command`` by its own bounds, its start included
    (ANSWER_MARGIN): a test waiting for what a shim call does waits this long, never a
    shorter guess that a busy machine may pass. (A daemon-config.json requestTimeout longer
    than the default is the test's to add.)"""
    from multusd.wire import shim

    if command == "STATUS":
        return shim.STATUS_PROBE_TIMEOUT + shim.STATUS_TIMEOUT + shim.ANSWER_MARGIN
    return shim.READY_TIMEOUT + shim.REQUEST_TIMEOUT + shim.ANSWER_MARGIN


def call_shim(command: str, conf: Mapping[str, Any], *, container_id: str = "", netns: str = "",
              ifname: str = "eth0", pod: tuple[str, str] = ("default", "pod"), uid: str = "",
              cni_args: str | None = None, timeout: float | None = None,
              env_extra: Mapping[str, str] | None = None,
              argv: Sequence[str] | None = None) -> ShimOutput:
    """Run the real shim as a runtime would; ``output`` is its parsed stdout (or None).

    :param timeout: how long the shim may take: by default :func:`shim_bound` (its own).
    :param argv: another shim to run instead of multusd's (e.g. upstream's ``multus-shim``).
    """
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
           "CNI_IFNAME": ifname, "CNI_PATH": "/opt/cni/bin"}
    if cni_args is None:
        cni_args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod[0]};K8S_POD_NAME={pod[1]};"
                    f"K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={uid}")
    env["CNI_ARGS"] = cni_args
    env.update(env_extra or {})
    proc = subprocess.run(list(argv or SHIM_ARGV), input=json.dumps(conf).encode(),
                          env=env, capture_output=True,
                          timeout=shim_bound(command) if timeout is None else timeout)
    text = proc.stdout.decode().strip()
    return ShimOutput(proc.returncode, json.loads(text) if text else None, proc.stderr.decode())


class HeldSocket:
    """A listening socket held across daemons, as multusd.socket holds it under systemd: each
    daemon started on it inherits it (LISTEN_FDS and LISTEN_PID, the real protocol), and a
    connection made while none runs waits in its backlog for the next one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(128)

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run with this socket as its fd 3 (exec'd: the launcher's pid is the
        daemon's, as LISTEN_PID says)."""
        launch = ("import os, sys; os.dup2(%d, 3); os.environ['LISTEN_FDS'] = '1'; "
                  "os.environ['LISTEN_PID'] = str(os.getpid()); "
                  "os.execvp(sys.argv[1], sys.argv[1:])" % self.sock.fileno())
        return [PYTHON, "-S", "-c", launch, *command]

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class DaemonProcess:
    """``multusd serve`` under systemd-socket-activate, in a private directory (or, with
    ``hold_socket``, on a :class:`HeldSocket` that outlives it, for a daemon started again)."""

    def __init__(self, config: Mapping[str, Any], workdir: str | None = None,
                 env: Mapping[str, str] | None = None,
                 command: Sequence[str] | None = None, hold_socket: bool = False) -> None:
        """:param command: how to run multusd (default: this interpreter's ``-m multusd``;
        the benchmark passes the packaged launcher form, ``/usr/bin/python3 -I ...``)."""
        self.command = list(command or (PYTHON, "-m", "multusd"))
        self.extra_env = dict(env or {})
        self.workdir = workdir or tempfile.mkdtemp(prefix="multusd-test-")
        self.socket_dir = os.path.join(self.workdir, "run")
        self.socket_path = os.path.join(self.socket_dir, "multus.sock")
        self.cni_dir = os.path.join(self.workdir, "cni")
        self.config_path = os.path.join(self.workdir, "daemon-config.json")
        self.log_path = os.path.join(self.workdir, "daemon.log")
        full = {"socketDir": self.socket_dir, "cniDir": self.cni_dir, "binDir": PLUGIN_DIR,
                "logLevel": "debug", "logToStderr": True}
        full.update(config)
        full = {key: value for key, value in full.items() if value is not None}  # None: unset
        self.cni_dir = full.get("cniDir", self.cni_dir)
        self.config = full
        os.makedirs(self.socket_dir, mode=0o700, exist_ok=True)
        with open(self.config_path, "w") as handle:
            json.dump(full, handle)
        self.proc: subprocess.Popen | None = None
        self.held = HeldSocket(self.socket_path) if hold_socket else None

    def start(self, activate: bool = True) -> "DaemonProcess":
        """Listen through systemd-socket-activate (or start on the held socket);
        ``activate`` waits for /healthz."""
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        serve = [*self.command, "serve", "--config", self.config_path]
        if self.held is not None:
            env.update(self.extra_env)
            self.proc = subprocess.Popen(self.held.argv(serve), stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         pass_fds=(self.held.sock.fileno(),),
                                         start_new_session=True)
        else:
            # systemd-socket-activate hands the child only the variables named with -E.
            passed = [arg for key, value in self.extra_env.items()
                      for arg in ("-E", f"{key}={value}")]
            self.proc = subprocess.Popen(
                ["systemd-socket-activate", "-l", self.socket_path, *passed, *serve],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        wait_for(lambda: os.path.exists(self.socket_path), start_bound(),
                 what="the activation socket")
        if activate:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float | None = None) -> None:
        from multusd.wire import api

        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"multusd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                return api.http_request(self.socket_path, "GET", "/healthz", timeout=2).status == 200
            except OSError:
                return False

        wait_for(healthy, start_bound() if timeout is None else timeout, what="multusd /healthz")

    def shim_conf(self, cni_version: str = "0.3.1", **extra: Any) -> dict:
        """What generate-config writes for this daemon: its socket and its cniDir (where the
        shim marks a sandbox whose DEL failed)."""
        return shim_conf(self.socket_dir, cni_version, **{"cniDir": self.cni_dir, **extra})

    def log(self) -> str:
        return read_log(self.log_path)

    def terminate(self, timeout: float | None = None) -> int | None:
        """SIGTERM and wait (by default as long as systemd would); SIGKILL the group if it
        does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(unit_stop_timeout() if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None

    def cleanup(self) -> None:
        self.terminate()
        if self.held is not None:
            self.held.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def new_netns() -> tuple[str, str]:
    """A real network namespace (name, path) with lo up."""
    name = f"mdt-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    return name, f"/var/run/netns/{name}"


def del_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def del_link(name: str) -> None:
    subprocess.run(["ip", "link", "del", name], capture_output=True)


def netns_addresses(name: str) -> dict[str, list[str]]:
    out = subprocess.run(["ip", "-n", name, "-j", "addr", "show"], check=True,
                         capture_output=True, text=True).stdout
    return {link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                             if a.get("family") == "inet"]
            for link in json.loads(out)}


STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs")


class Sandbox:
    """Everything one test makes (bridges, namespaces, daemons) in one place, removed by
    :meth:`cleanup`. Its bin dir holds the real plugins and the test stubs side by side."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.leases = os.path.join(workdir, "leases")
        self.bin_dir = os.path.join(workdir, "bin")
        self._bridges: list[str] = []
        self._netns: list[str] = []
        self._daemons: list[DaemonProcess] = []
        os.makedirs(self.bin_dir)
        for directory in (PLUGIN_DIR, STUBS):
            for name in os.listdir(directory):
                os.symlink(os.path.join(directory, name), os.path.join(self.bin_dir, name))
        passthru = os.path.join(self.bin_dir, "passthru")  # ours, as the package installs it
        with open(passthru, "w") as handle:
            handle.write(f"#!{PYTHON}\nfrom multusd.cni.passthru import main\nraise SystemExit(main())\n")
        os.chmod(passthru, 0o755)

    def bridge(self) -> str:
        name = f"mdb{uuid.uuid4().hex[:8]}"
        self._bridges.append(name)
        return name

    def netns(self) -> tuple[str, str]:
        name, path = new_netns()
        self._netns.append(name)
        return name, path

    def net(self, name: str, subnet: str, **kw: Any) -> dict:
        return bridge_conf(name, self.bridge(), subnet, self.leases, **kw)

    def daemon(self, config: dict, activate: bool = True,
               env: Mapping[str, str] | None = None, hold_socket: bool = False,
               command: Sequence[str] | None = None) -> DaemonProcess:
        config.setdefault("binDir", self.bin_dir)
        proc = DaemonProcess(config, workdir=os.path.join(self.workdir, f"d{len(self._daemons)}"),
                             env=env, hold_socket=hold_socket, command=command)
        self._daemons.append(proc)
        return proc.start(activate=activate)

    def leases_held(self) -> list[str]:
        held: list[str] = []
        for _, _, files in os.walk(self.leases):
            held += [f for f in files if f[0].isdigit()]
        return held

    def cleanup(self) -> None:
        for daemon in self._daemons:
            daemon.cleanup()
        for name in self._netns:
            del_netns(name)
        for name in self._bridges:
            del_link(name)


STATUS_KEY = "k8s.v1.cni.cncf.io/network-status"


class Cluster:
    """A fake API server, a confDir with the cluster network, and a daemon pointed at both."""

    def __init__(self, sandbox, kube, tmp_path) -> None:
        self.sandbox = sandbox
        self.kube = kube
        self.conf_dir = str(tmp_path / "confdir")
        os.makedirs(self.conf_dir)
        self.cluster = sandbox.net("cluster-net", "10.80.0.0/24", cni_version="0.4.0")
        self.cluster_path = os.path.join(self.conf_dir, "10-cluster.conf")
        with open(self.cluster_path, "w") as handle:
            json.dump(self.cluster, handle)
        self.daemon = None

    def nad(self, name: str, subnet: str, namespace: str = "default", gateway: bool = False,
            **extra) -> dict:
        conf = self.sandbox.net(name, subnet, cni_version="0.4.0", gateway=gateway)
        conf.pop("name")  # upstream injects the NAD name when the config has none
        conf.update(extra)
        self.kube.add_nad(namespace, name, json.dumps(conf))
        return conf

    def start(self, env: Mapping[str, str] | None = None,
              command: Sequence[str] | None = None, **config: Any) -> "Cluster":
        """Start the daemon (``command``: how to run multusd, e.g. its packaged launcher,
        :func:`launcher_argv`); a config key given as None is left out (``nodeName=None``)."""
        from multusd.wire import api

        full = {"cniVersion": "0.4.0", "kubeconfig": self.kube.kubeconfig_path,
                "nodeName": self.kube.node, "confDir": self.conf_dir,
                "clusterNetwork": self.cluster_path, "multusNamespace": "kube-system"}
        full.update(config)  # a None is left out by DaemonProcess (its own defaults too)
        self.daemon = self.sandbox.daemon(full, env=env, command=command)
        wait_for(lambda: api.http_request(self.daemon.socket_path, "GET", "/readyz",
                                          timeout=2).status == 200, start_bound(),
                 what="caches synced")
        return self

    def pod(self, name: str, namespace: str = "default", annotations=None, **kw) -> dict:
        return self.kube.add_pod(namespace, name, annotations=annotations or {}, **kw)

    def shim(self, command: str, pod: dict, netns: str, cid: str, **kw):
        meta = pod["metadata"]
        return call_shim(command, self.daemon.shim_conf("0.4.0"), container_id=cid, netns=netns,
                         pod=(meta["namespace"], meta["name"]), uid=kw.pop("uid", meta["uid"]),
                         **kw)

    def status(self, namespace: str, name: str) -> list:
        pod = self.kube.pod(namespace, name)
        return json.loads(pod["metadata"]["annotations"][STATUS_KEY])

    def events(self, reason: str) -> list:
        return [e for e in self.kube.events if e.get("reason") == reason]
