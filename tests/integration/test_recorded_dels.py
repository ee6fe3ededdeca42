"""A DEL is recorded where its request put the sandbox, and found there by everything that comes
after (issue 37, scenario 2): the daemon's own retries, ``multusd status``/``show``/``doctor``,
the ``multusd_unreleased_sandboxes`` gauge, and the shim when the daemon cannot answer.

The daemon and the tools through their packaged launcher (harness.launcher_argv), the daemon
under systemd-socket-activate, restarted between ADD and DEL; the real shim, fed the runtime's
multus config as generate-config wrote it, in a mount namespace of its own where
/etc/cni/net.d/multus.d/daemon-config.json is the daemon's (as on a node) and /var/lib is the
test's (Multus's default cniDir, /var/lib/cni/multus, never the host's); bridge and host-local
in real namespaces, the stand-in API server. A delegate's DEL fails because its plugin binary
is gone (``bridge-vendor``: the real bridge under another name, removed by the test), until
the test puts it back.

* the packaged auto mode: daemon-config.json names the cniDir, the generated 00-multus.conf
  carries it;
* an operator's static multus config names a cniDir, daemon-config.json none: the requests
  record there, and before issue 37 the retrier, the gauge and the tools looked in Multus's
  default directory alone (never retried nor shown: its leases leaked unreported);
* the reverse, the static config naming none and daemon-config.json one: the shim's marks land
  beside the daemon's records, with the daemon's published window (before, in the default
  directory with the default window).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid

import pytest

from harness import Cluster, call_shim, launcher_argv, shim_bound, start_bound
from multusd.daemon import delretry
from multusd.wire import api, delwindow
from testlib import free_port, metric_value, wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"
WINDOW = 3
MARKS = ".multusd-unreleased"
MULTUSD = launcher_argv("multusd")


class Node:
    """A Cluster whose daemon runs through its launcher, its runtime config on disk as
    generate-config writes it (``mode``: ``auto``, ``static`` naming its own cniDir, or
    ``static-without-cnidir`` with daemon-config.json naming one)."""

    def __init__(self, sandbox, kube, tmp_path, mode: str) -> None:
        if not os.path.isdir("/etc/cni"):
            pytest.skip("no /etc/cni to mount daemon-config.json's place over for the shim")
        self.cluster = Cluster(sandbox, kube, tmp_path)
        self.mode = mode
        self.net_d = str(tmp_path / "net.d")  # cniConfigDir: where the runtime's config goes
        os.makedirs(self.net_d)
        self.var_lib = str(tmp_path / "var-lib")  # the shim's /var/lib
        os.makedirs(os.path.join(self.var_lib, "cni"))
        self.port = free_port()
        self.config: dict = {"cniConfigDir": self.net_d, "clusterNetwork": None,
                             "deleteRetryWindow": WINDOW, "metricsPort": self.port}
        self.cni_dir = ""  # where requests record: the daemon's own unless the file names one
        if mode == "auto":
            self.config.update(multusConfigFile="auto",
                               multusAutoconfigDir=self.cluster.conf_dir)
        else:
            static = str(tmp_path / "ops" / "multus.conf")
            os.makedirs(os.path.dirname(static))
            doc = {"cniVersion": "0.4.0", "name": "multus-cni-network", "type": "multus-shim",
                   "clusterNetwork": self.cluster.cluster_path}
            if mode == "static":  # its cniDir; daemon-config.json names none
                self.cni_dir = doc["cniDir"] = str(tmp_path / "static-cni")
                self.config["cniDir"] = None
            with open(static, "w") as handle:
                json.dump(doc, handle)
            self.config["multusConfigFile"] = static
        self.plugin = os.path.join(sandbox.bin_dir, "bridge-vendor")
        self.target = os.path.realpath(os.path.join(sandbox.bin_dir, "bridge"))
        os.symlink(self.target, self.plugin)
        self.cluster.nad("vendor", "10.97.0.0/24", type="bridge-vendor")

    @property
    def daemon(self):
        return self.cluster.daemon

    def start(self) -> "Node":
        self.cluster.start(command=MULTUSD, **self.config)
        self.cni_dir = self.cni_dir or self.daemon.cni_dir
        self.tool("generate-config", as_json=False)
        return self

    def restart(self) -> None:
        self.daemon.terminate()
        self.daemon.start()
        wait_for(lambda: api.http_request(self.daemon.socket_path, "GET", "/readyz",
                                          timeout=2).status == 200, start_bound(),
                 what="caches synced")

    def runtime_conf(self) -> dict:
        """What the runtime sends the shim (the socket's directory added: the test's daemon
        does not listen on /run/multus)."""
        name = "00-multus.conf" if self.mode == "auto" else "multus.conf"
        with open(os.path.join(self.net_d, name)) as handle:
            conf = json.load(handle)
        return dict(conf, daemonSocketDir=self.daemon.socket_dir)

    def shim(self, command: str, pod: dict, netns: str, cid: str):
        """The shim as the runtime runs it, where daemon-config.json is at its place."""
        private = ["unshare", "-m", "--propagation", "slave", "sh", "-ec",
                   'mount -t tmpfs tmpfs /etc/cni; mkdir -p /etc/cni/net.d/multus.d; '
                   'ln -s "$0" /etc/cni/net.d/multus.d/daemon-config.json; '
                   'mount --bind "$1" /var/lib; shift; exec "$@"',
                   self.daemon.config_path, self.var_lib, *launcher_argv("multus-shim")]
        meta = pod["metadata"]
        return call_shim(command, self.runtime_conf(), container_id=cid, netns=netns,
                         pod=(meta["namespace"], meta["name"]), uid=meta["uid"], argv=private)

    def attach(self, name: str, networks: str = ""):
        pod = self.cluster.pod(name, annotations={NETWORKS_KEY: networks} if networks else {})
        _, ns_path = self.cluster.sandbox.netns()
        cid = uuid.uuid4().hex
        add = self.shim("ADD", pod, ns_path, cid)
        assert add.code == 0, add.output
        return pod, ns_path, cid

    def del_until_answered(self, pod, ns_path: str, cid: str) -> list:
        """DEL again and again, as kubelet does, until it is answered success."""
        answers = []

        def answered() -> bool:
            answers.append(self.shim("DEL", pod, ns_path, cid))
            return answers[-1].code == 0

        wait_for(answered, WINDOW + shim_bound("DEL"), interval=0.2, what="DEL answered success")
        return answers

    def tool(self, *args: str, as_json: bool = True):
        proc = subprocess.run([*MULTUSD, *args, "--config", self.daemon.config_path]
                              + (["--json"] if as_json else []), capture_output=True,
                              text=True, timeout=120)
        if not as_json:
            assert proc.returncode in (0, 1), proc.stderr
            return proc.returncode, proc.stdout
        return proc.returncode, json.loads(proc.stdout)

    def gauge(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                    timeout=10) as response:
            return metric_value(response.read().decode(), "multusd_unreleased_sandboxes")

    def mark(self, cid: str, cni_dir: str = "") -> dict:
        with open(os.path.join(cni_dir or self.cni_dir, MARKS, cid)) as handle:
            return json.load(handle)

    def shims_default_mark(self, cid: str) -> str:
        """Where a shim that knows no cniDir marks: Multus's default, in its /var/lib."""
        return os.path.join(self.var_lib, "cni", "multus", MARKS, cid)

    def released(self, cid: str) -> float:
        """Wait for the daemon's own retries to release ``cid``: its start, or the next step
        of its backoff, then that DEL; the seconds it took."""
        started = time.monotonic()
        wait_for(lambda: not self.cluster.sandbox.leases_held() and
                 not os.path.exists(os.path.join(self.cni_dir, cid)) and
                 f"unreleased sandbox {cid} (default/" in self.daemon.log(),
                 start_bound() + delretry.RETRY_MAX * (1 + delretry.RETRY_JITTER)
                 + shim_bound("DEL"), interval=0.1, what="the daemon to release the sandbox")
        return time.monotonic() - started


@pytest.fixture(params=["auto", "static"])
def node(request, sandbox, kube_api, tmp_path) -> Node:
    return Node(sandbox, kube_api, tmp_path, request.param)


def test_a_del_recorded_in_the_requests_cni_dir_is_retried_shown_and_released(node):
    node.start()
    pod, ns_path, cid = node.attach("leaky", "vendor")
    assert os.path.exists(os.path.join(node.cni_dir, cid))  # the static file's, or the daemon's
    node.restart()  # between ADD and DEL
    os.unlink(node.plugin)  # its package was removed: DEL fails for good

    answers = node.del_until_answered(pod, ns_path, cid)

    assert answers[0].code == 1 and "install bridge-vendor again" in answers[0].output["msg"]
    mark = node.mark(cid)  # beside the records
    assert mark["by"] == "daemon" and mark["cniDir"] == node.cni_dir
    assert len(node.cluster.sandbox.leases_held()) == 1  # net1's lease is held
    code, status = node.tool("status")
    assert code == 1 and node.cni_dir in status["cniDirs"]
    [sandbox] = [s for s in status["sandboxes"] if s["containerId"] == cid]
    assert sandbox["failedDelete"]["state"] == "unreleased"
    assert any(cid in p and "UNRELEASED" in p for p in status["problems"])
    assert "DEL:        UNRELEASED" in node.tool("show", cid, "--no-api", as_json=False)[1]
    code, doctor = node.tool("doctor")
    [check] = [c for c in doctor["checks"] if c["name"] == "unreleased"]
    assert check["status"] == "fail" and cid in " ".join(check["details"])
    assert node.gauge() == 1
    # the daemon retries it by itself (at the window's end, then on its backoff): one attempt
    # more than the runtime's DELs (past the window the daemon answers success: a failed
    # retry says nothing more than its mark)
    wait_for(lambda: node.mark(cid)["attempts"] > len(answers),
             start_bound() + delretry.RETRY_MAX * (1 + delretry.RETRY_JITTER)
             + shim_bound("DEL"), interval=0.1, what="the daemon's own retry")

    os.symlink(node.target, node.plugin)  # the plugin is back
    took = node.released(cid)

    print(f"[{node.mode}] released {took:.1f}s after the plugin came back")  # (pytest -s)
    assert not os.path.exists(os.path.join(node.cni_dir, MARKS, cid))
    assert node.gauge() == 0
    assert cid not in [s["containerId"] for s in node.tool("status")[1]["sandboxes"]]
    assert not os.path.exists(os.path.join(node.var_lib, "cni", "multus", cid))


def test_the_shim_marks_beside_the_daemons_records_with_its_window(sandbox, kube_api,
                                                                    tmp_path):
    # the runtime's static multus config names no cniDir; daemon-config.json names one
    node = Node(sandbox, kube_api, tmp_path, "static-without-cnidir").start()
    assert "cniDir" not in node.runtime_conf()
    pod, ns_path, cid = node.attach("failing", "vendor")
    quiet_pod, quiet_ns, quiet = node.attach("quiet")
    os.unlink(node.plugin)

    failed = node.shim("DEL", pod, ns_path, cid)  # the daemon's delegate fails

    assert failed.code == 1 and node.mark(cid)["by"] == "daemon"
    assert not os.path.exists(node.shims_default_mark(cid))  # (it marked there, apart)
    node.daemon.terminate()  # multusd down: the shim marks the sandbox itself

    down = node.shim("DEL", quiet_pod, quiet_ns, quiet)

    assert down.code == 1 and "not reachable" in down.output["msg"]
    mark = node.mark(quiet)  # beside the records, with the daemon's window
    assert (mark["by"], mark["window"], mark["cniDir"]) == ("shim", WINDOW, node.cni_dir)
    assert delwindow.DEFAULT_WINDOW != WINDOW
    assert not os.path.exists(node.shims_default_mark(quiet))
    answers = node.del_until_answered(quiet_pod, quiet_ns, quiet)
    assert "has passed, so DEL answers success" in answers[-1].stderr
    assert node.mark(quiet)["attempts"] == 1 + len(answers)

    os.symlink(node.target, node.plugin)
    node.daemon.start()  # it releases both at its start
    node.released(quiet)
    node.released(cid)

    assert not os.listdir(os.path.join(node.cni_dir, MARKS)) or \
        os.listdir(os.path.join(node.cni_dir, MARKS)) == [".settings"]
    assert node.gauge() == 0
