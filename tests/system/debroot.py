"""Build and cache the Debian roots (12 "bookworm", 13 "trixie") the booted-systemd tests run in.

Each root is made once with debootstrap and kept as a tarball under CACHE_DIR; its name carries
the suite and a hash of the package list (the package's Depends and Recommends, read from
packaging/nfpm.yaml, plus what the tests run), so changing the list builds a new one (and drops
the suite's older ones: a cache that only grows fills /var/cache over the rounds). The mirror
is read from the host's own apt sources at run time (the Debian archive that serves the host's
release serves every release): the private network inside the container has no way out, so
every runtime dependency of the package under test is put into the root here.

``python3 tests/system/debroot.py [SUITE]`` builds (or finds) one and prints its path.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Iterable, List, Optional

LOG = logging.getLogger(__name__)

CACHE_DIR = "/var/cache/multusd-test"
# The Debian releases the package is tested on: oldstable (python 3.11) and stable (3.13).
SUITES = ("bookworm", "trixie")
VERSIONS = {"bookworm": "Debian 12", "trixie": "Debian 13"}
NFPM_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "packaging", "nfpm.yaml")
# What the tests run inside, besides the package's own Depends and Recommends.
BASE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "apt", "iproute2", "python3",
    # the .rpm's scriptlets run for real too (rpm -i / rpm -e in the booted container)
    "rpm",
    # the stand-in API server (tests/kubeapi.py) runs inside, and the unit and integration
    # suites run on the root's own python3 (tests/system/suiterun.py): pytest, openssl for
    # its TLS certificates, iptables for the portmap plugin
    "python3-pytest", "openssl", "iptables",
)
# How long the archive may take to answer before it counts as out of reach.
REACH_TIMEOUT = 30.0


class ArchiveUnreachable(RuntimeError):
    """The host's Debian archive did not answer: the root cannot be built here and now."""


def package_relations() -> List[str]:
    """The .deb's Depends and Recommends names, read from packaging/nfpm.yaml."""
    import yaml  # python3-yaml: a dependency of python3-kubernetes

    with open(NFPM_YAML) as f:
        recipe = yaml.safe_load(f)
    names = []
    for relation in recipe.get("depends", []) + recipe.get("recommends", []):
        names.append(relation.split()[0])
    return names


def packages() -> List[str]:
    """Everything the root needs, so that the .deb installs offline in the container."""
    return sorted(set(BASE_PACKAGES) | set(package_relations()))


def cached_root_tarball(suite: str) -> str:
    """The path of the cached root tarball of ``suite`` for the current package list (may not
    exist yet)."""
    digest = hashlib.sha256(" ".join(packages()).encode()).hexdigest()[:12]
    return os.path.join(CACHE_DIR, f"{suite}-root-{digest}.tar")


def _deb822_uris(text: str) -> Iterable[tuple]:
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split():
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split()


def _one_line_uris(text: str) -> Iterable[tuple]:
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line).split()
        if len(words) >= 3 and words[0] == "deb":
            yield words[1], [words[2]]


def _host_sources() -> Iterable[tuple]:
    """(uri, suites) of every deb source of the host's apt, deb822 files first."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        yield from _deb822_uris(open(path).read())
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        if os.path.exists(path):
            yield from _one_line_uris(open(path).read())


def host_codename() -> str:
    """The host's own release (VERSION_CODENAME of /etc/os-release), "" when it names none."""
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("VERSION_CODENAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return ""


def host_mirror(suite: str) -> Optional[str]:
    """The URI of the host's apt source that serves ``suite`` itself (not -security/-updates),
    else the one that serves the host's own release: the same archive holds every release."""
    sources = list(_host_sources())
    for wanted in (suite, host_codename()):
        for uri, suites in sources:
            if wanted and wanted in suites:
                return uri
    return None


def check_reachable(mirror: str, suite: str) -> None:
    """Raise ArchiveUnreachable unless ``mirror`` answers for ``suite``'s Release file."""
    url = f"{mirror.rstrip('/')}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(url, timeout=REACH_TIMEOUT) as answer:
            answer.read(1)
    except (urllib.error.URLError, OSError) as exc:
        raise ArchiveUnreachable(
            f"debootstrap cannot reach the Debian archive for {suite} ({url}: {exc})") from exc


def build_root_tarball(suite: str, target: str) -> None:
    """Run debootstrap into a scratch dir and pack it as ``target`` (written via rename)."""
    mirror = host_mirror(suite)
    if mirror is None:
        raise RuntimeError(
            f"no apt source for {suite!r} or {host_codename()!r} in /etc/apt/sources.list*: "
            "add one so debootstrap has a mirror to read")
    check_reachable(mirror, suite)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"debroot-{suite}-", dir=os.path.dirname(target))
    try:
        root = os.path.join(work, "root")
        argv = ["debootstrap", "--variant=minbase", suite, root, mirror]
        LOG.info("building the test root: %s", " ".join(argv))
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap failed (exit {done.returncode}):\n"
                               f"{done.stdout[-3000:]}{_debootstrap_log(root)}")
        _install_packages(root, packages())
        _prepare_root(root)
        partial = target + ".partial"
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", partial, "."],
                       check=True)
        os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# apt inside the new root, with /proc of a mount namespace of its own (gone when it exits) and
# no service started (nothing runs systemd in a chroot; policy-rc.d stops sysv scripts too).
APT_IN_ROOT = """
set -e
root=$1
shift
mount -t proc proc "$root/proc"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
chroot "$root" apt-get update -qq
chroot "$root" apt-get install -y -qq --no-install-recommends "$@"
chroot "$root" apt-get clean
rm -f "$root/usr/sbin/policy-rc.d"
"""


def _install_packages(root: str, names: List[str]) -> None:
    """apt-get install ``names`` in the root: apt resolves what debootstrap's --include
    cannot (a dependency on a virtual package, e.g. trixie's libre2-11-absl20240722)."""
    env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin", LANG="C.UTF-8",
               DEBIAN_FRONTEND="noninteractive")
    argv = ["unshare", "--mount", "--fork", "sh", "-c", APT_IN_ROOT, "apt-in-root", root, *names]
    LOG.info("installing into the test root: %s", " ".join(names))
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"apt-get install in the new root failed (exit {done.returncode}):"
                           f"\n{done.stdout[-3000:]}")


def _debootstrap_log(root: str) -> str:
    try:
        with open(os.path.join(root, "debootstrap", "debootstrap.log")) as f:
            return f.read()[-3000:]
    except OSError:
        return ""


def _prepare_root(root: str) -> None:
    # A fixed machine-id keeps journald's files in one place; nspawn would invent one otherwise.
    with open(os.path.join(root, "etc/machine-id"), "w") as f:
        f.write(hashlib.md5(b"multusd-test").hexdigest() + "\n")
    with open(os.path.join(root, "etc/hostname"), "w") as f:
        f.write("multusd-test\n")
    # Nothing in the container may try to reach the network or wait for it.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer",
                 "systemd-networkd-wait-online.service"):
        link = os.path.join(root, "etc/systemd/system", unit)
        if not os.path.lexists(link):
            os.symlink("/dev/null", link)
    shutil.rmtree(os.path.join(root, "var/cache/apt/archives"), ignore_errors=True)
    os.makedirs(os.path.join(root, "var/cache/apt/archives/partial"), exist_ok=True)


def ensure_root_tarball(suite: str) -> str:
    """The cached root tarball of ``suite``, built first if there is none yet.

    One build at a time per suite on the machine (a lock in CACHE_DIR): a second test run
    started meanwhile waits for the first one's root instead of building its own.
    """
    target = cached_root_tarball(suite)
    if os.path.exists(target):
        return target
    os.makedirs(CACHE_DIR, exist_ok=True)
    with open(os.path.join(CACHE_DIR, f".{suite}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(target):
            build_root_tarball(suite, target)
            for older in glob.glob(os.path.join(CACHE_DIR, f"{suite}-root-*.tar")):
                if older != target:  # a run still unpacking it keeps its open file
                    os.unlink(older)
    return target


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(ensure_root_tarball(sys.argv[1] if len(sys.argv) > 1 else SUITES[0]))
    sys.exit(0)
