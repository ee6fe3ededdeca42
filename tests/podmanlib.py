"""A private podman (Debian's, CNI network backend) for tests and the benchmark.

Everything podman keeps lives in one work directory: storage (``--root``/``--runroot``, vfs),
libpod's tmpdir, the CNI network configs, the plugin dir holding ``multus-shim`` (the
package's launcher, pointed at this tree), runc's state dir (a wrapper named in
containers.conf, so conmon's cleanup uses it too) and a cgroup parent of its own. No
registry is configured: the one image is imported from a tarball holding busybox-static.
Outside it podman writes two things it has no setting for: libcni's result cache directory
``/var/lib/cni/results`` (its entries are removed on DEL; the directory stays) and, on
``podman import``, containers/image's blob-info cache under ``/var/lib/containers/cache``
(removed at cleanup when this installation created it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import uuid

from testlib import PLUGIN_DIR, REPO

PODMAN = shutil.which("podman")
RUNC = shutil.which("runc")
BUSYBOX = "/usr/bin/busybox"  # busybox-static: runs in an image with nothing else
IMAGE = "localhost/multusd-test-busybox:latest"
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
LIBCNI_CACHE = "/var/lib/cni/results"
CGROUP_ROOT = "/sys/fs/cgroup"
BLOB_INFO_CACHE = "/var/lib/containers/cache/blob-info-cache-v1.boltdb"


def missing() -> str:
    """Why podman cannot be used here ("" when it can be)."""
    absent = [name for name, path in (("podman", PODMAN), ("runc", RUNC)) if not path]
    if not os.access(BUSYBOX, os.X_OK):
        absent.append("busybox-static")
    if absent:
        return (f"{', '.join(absent)} not installed (Debian packages; "
                "scripts/install-deps installs them)")
    return ""


class Podman:
    """One private podman installation; :meth:`cleanup` removes all of it."""

    def __init__(self, workdir: str | None = None) -> None:
        # Short: podman refuses a runroot path over 50 characters (pytest's tmp_path is longer).
        self.workdir = workdir or tempfile.mkdtemp(prefix="mdpm-")
        self.net_dir = os.path.join(self.workdir, "net.d")
        self.bin_dir = os.path.join(self.workdir, "cni-bin")
        self.cgroup_parent = f"/mdtpm{uuid.uuid4().hex[:8]}"
        self._owns_blob_cache = not os.path.exists(BLOB_INFO_CACHE)
        for sub in ("root", "runroot", "tmp", "runc", "net.d", "cni-bin"):
            os.makedirs(os.path.join(self.workdir, sub), exist_ok=True)
        self._write_configs()
        self._install_shim()

    def _path(self, sub: str) -> str:
        return os.path.join(self.workdir, sub)

    def _write_configs(self) -> None:
        runc = self._path("runc-private")
        with open(runc, "w") as handle:  # runc's state dir of its own, for conmon too
            handle.write(f"#!/bin/sh\nexec {RUNC} --root {self._path('runc')} \"$@\"\n")
        os.chmod(runc, 0o755)
        with open(self._path("containers.conf"), "w") as handle:
            handle.write(f"""[network]
network_backend = "cni"
network_config_dir = "{self.net_dir}"
cni_plugin_dirs = ["{self.bin_dir}", "{PLUGIN_DIR}"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "none"
runtime = "private"
tmp_dir = "{self._path('tmp')}"

[engine.runtimes]
private = ["{runc}"]
""")
        with open(self._path("storage.conf"), "w") as handle:
            handle.write(f"""[storage]
driver = "vfs"
graphroot = "{self._path('root')}"
runroot = "{self._path('runroot')}"
""")
        with open(self._path("registries.conf"), "w") as handle:
            handle.write("unqualified-search-registries = []\n")

    def _install_shim(self) -> None:
        """packaging/multus-shim.launcher, its code path pointed at this tree."""
        with open(os.path.join(REPO, "packaging", "multus-shim.launcher")) as handle:
            launcher = handle.read().replace('"/usr/lib/multusd"', repr(REPO))
        shim = os.path.join(self.bin_dir, "multus-shim")
        with open(shim, "w") as handle:
            handle.write(launcher)
        os.chmod(shim, 0o755)

    @property
    def env(self) -> dict:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "HOME": self.workdir,
               "CONTAINERS_CONF": self._path("containers.conf"),
               "CONTAINERS_STORAGE_CONF": self._path("storage.conf"),
               "CONTAINERS_REGISTRIES_CONF": self._path("registries.conf")}
        return env

    def argv(self, *args: str) -> list:
        return [PODMAN, "--root", self._path("root"), "--runroot", self._path("runroot"),
                "--tmpdir", self._path("tmp"), "--storage-driver", "vfs",
                "--network-config-dir", self.net_dir, "--cgroup-manager", "cgroupfs",
                "--events-backend", "none", *args]

    def __call__(self, *args: str, check: bool = True,
                 timeout: float = 120.0) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stderr}{proc.stdout}")
        return proc

    def run_args(self, *args: str) -> list:
        """``podman run`` arguments every container here needs, then ``args``."""
        return ["run", "--pull=never", "--cgroup-parent", self.cgroup_parent, *ULIMITS, *args]

    def import_busybox(self) -> str:
        """The image: a tarball of busybox-static and an index.html, ``podman import``-ed."""
        tarball = self._path("busybox.tar")
        page = self._path("index.html")
        with open(page, "w") as handle:
            handle.write("multusd via podman\n")
        with tarfile.open(tarball, "w") as tar:
            tar.add(BUSYBOX, arcname="bin/busybox")
            tar.add(page, arcname="www/index.html")
        self("import", tarball, IMAGE)
        return IMAGE

    def network(self, name: str, plugins: list) -> str:
        """A CNI conflist in the private network dir (podman finds networks by their name)."""
        conflist = {"cniVersion": "0.4.0", "name": name, "plugins": plugins}
        with open(os.path.join(self.net_dir, f"{name}.conflist"), "w") as handle:
            json.dump(conflist, handle)
        return name

    def cleanup(self) -> None:
        if PODMAN:
            self("rm", "--all", "--force", "--time", "0", check=False)
            self("rmi", "--all", "--force", check=False)
        for mount in reversed(_mounts_under(self.workdir)):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        _remove_cgroup(self.cgroup_parent)
        if self._owns_blob_cache:
            _remove_blob_cache()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _mounts_under(directory: str) -> list:
    with open("/proc/self/mounts") as handle:
        points = [line.split()[1] for line in handle]
    return [p for p in points if p == directory or p.startswith(directory + "/")]


def _remove_cgroup(parent: str) -> None:
    """rmdir the cgroup parent (and its empty children) in every hierarchy podman used."""
    try:
        hierarchies = [os.path.join(CGROUP_ROOT, h) for h in os.listdir(CGROUP_ROOT)]
    except OSError:
        return
    for base in hierarchies + [CGROUP_ROOT]:
        top = base + parent
        if not os.path.isdir(top):
            continue
        for root, dirs, _ in os.walk(top, topdown=False):
            for name in dirs:
                _rmdir(os.path.join(root, name))
        _rmdir(top)


def _remove_blob_cache() -> None:
    """The blob-info cache ``podman import`` made, and its directories if nothing else is there."""
    try:
        os.unlink(BLOB_INFO_CACHE)
    except OSError:
        return
    _rmdir(os.path.dirname(BLOB_INFO_CACHE))
    _rmdir(os.path.dirname(os.path.dirname(BLOB_INFO_CACHE)))


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
