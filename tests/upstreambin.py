"""Upstream Multus thick (the Go ``multus-daemon`` and ``multus-shim``) run on this host, for the
optional tests that hand a node between it and multusd.

``$MULTUSD_UPSTREAM_BIN`` names a directory holding upstream's v4.x ``multus-daemon`` and
``multus-shim``; nothing of upstream is part of this repository, and without the variable the
tests that need them skip, saying so. The daemon runs with a daemon-config.json whose paths are
the test's, the same plugins and fake API server (tests/kubeapi.py, which must serve TLS:
upstream builds its client from the in-cluster config only, ``https://$KUBERNETES_SERVICE_HOST``
plus the token and CA under /var/run/secrets/kubernetes.io/serviceaccount). Those two files are
bind-mounted over /run/secrets in a mount namespace of the daemon's own, so the host's stays
untouched (an empty /run/secrets is made if missing, and removed after).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from typing import Any, Dict, Optional

import pytest

from harness import read_log, shim_conf
from testlib import bind_in_private_mounts, wait_for

ENV = "MULTUSD_UPSTREAM_BIN"
DAEMON, SHIM = "multus-daemon", "multus-shim"
SECRETS = "/run/secrets"


def bin_dir() -> str:
    """``$MULTUSD_UPSTREAM_BIN``, checked; skips the calling test when it is not usable."""
    directory = os.environ.get(ENV, "")
    if not directory:
        pytest.skip(f"{ENV} is not set: it names a directory with upstream Multus v4.x's "
                    f"{DAEMON} and {SHIM} (built outside this repository)")
    missing = [n for n in (DAEMON, SHIM) if not os.access(os.path.join(directory, n), os.X_OK)]
    if missing:
        pytest.skip(f"{ENV}={directory} lacks {', '.join(missing)}")
    return directory


class UpstreamDaemon:
    """``multus-daemon -config <workdir>/daemon-config.json`` in its own mount namespace."""

    def __init__(self, directory: str, kube_api, workdir: str, **config: Any) -> None:
        assert kube_api.tls, "upstream's daemon talks to the API server over TLS only"
        self.workdir = workdir
        self.socket_dir = os.path.join(workdir, "run")
        self.log_path = os.path.join(workdir, "daemon.log")
        self.config_path = os.path.join(workdir, "daemon-config.json")
        self.shim_argv = [os.path.join(directory, SHIM)]
        self._argv = [os.path.join(directory, DAEMON), "-config", self.config_path]
        self._env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                     "MULTUS_NODE_NAME": kube_api.node,
                     "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                     "KUBERNETES_SERVICE_PORT": str(kube_api.port)}
        self._secrets = os.path.join(workdir, "secrets")
        account = os.path.join(self._secrets, "kubernetes.io", "serviceaccount")
        os.makedirs(account, mode=0o700)
        with open(os.path.join(account, "token"), "w") as handle:
            handle.write(kube_api.token)
        shutil.copyfile(kube_api.ca_path, os.path.join(account, "ca.crt"))
        out_dir = os.path.join(workdir, "net.d")  # where it writes its own 00-multus.conf
        os.makedirs(out_dir)
        full: Dict[str, Any] = {"cniVersion": "0.4.0", "logLevel": "debug",
                                "logToStderr": True, "socketDir": self.socket_dir,
                                "cniConfigDir": out_dir, "multusConfigFile": "auto"}
        full.update(config)
        with open(self.config_path, "w") as handle:
            json.dump(full, handle)
        self.proc: Optional[subprocess.Popen] = None
        self._made_mount_point = False

    def start(self) -> "UpstreamDaemon":
        self._made_mount_point = not os.path.lexists(SECRETS)
        if self._made_mount_point:
            os.mkdir(SECRETS, 0o755)
        private_mounts = bind_in_private_mounts(self._secrets, SECRETS)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._argv, stdout=log, stderr=subprocess.STDOUT,
                                         env=self._env, start_new_session=True,
                                         preexec_fn=private_mounts)
        try:
            wait_for(self._ready, 60, interval=0.05, what=f"upstream {DAEMON} /healthz")
        except AssertionError as exc:
            self.stop()  # never left running behind a failed test
            raise AssertionError(f"{exc}; its log:\n{self.log()[-3000:]}") from None
        return self

    def _ready(self) -> bool:  # /healthz: v4.3 has no /readyz yet
        from multusd.wire import api

        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{DAEMON} exited with {self.proc.returncode}:\n"
                                 f"{self.log()[-3000:]}")
        try:
            return api.http_request(os.path.join(self.socket_dir, "multus.sock"), "GET",
                                    "/healthz", timeout=2).status == 200
        except OSError:
            return False

    def shim_conf(self, cni_version: str = "0.4.0", **extra: Any) -> dict:
        return shim_conf(self.socket_dir, cni_version, **extra)

    def log(self) -> str:
        return read_log(self.log_path)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._made_mount_point:
            try:
                os.rmdir(SECRETS)
            except OSError:
                pass
            self._made_mount_point = False
