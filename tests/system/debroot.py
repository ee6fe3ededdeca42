"""Build and cache the Debian 12 root that the booted-systemd tests run in.

The root is made once with debootstrap and kept as a tarball under CACHE_DIR; its name carries a
hash of the package list (the package's Depends and Recommends, read from packaging/nfpm.yaml,
plus what the tests run), so changing the list builds a new one. The mirror is read from the
host's own apt sources at run time: the private network inside the container has no way out, so
every runtime dependency of the package under test is put into the root here.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Iterable, List, Optional

LOG = logging.getLogger(__name__)

CACHE_DIR = "/var/cache/multusd-test"
SUITE = "bookworm"
NFPM_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "packaging", "nfpm.yaml")
# What the test itself runs inside, besides the package's own Depends and Recommends.
BASE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "apt", "iproute2", "python3",
    # debootstrap does not resolve virtual packages: python3-cryptography (under
    # python3-kubernetes) needs python3-cffi-backend-api-*, which only this one provides.
    "python3-cffi-backend",
    # the .rpm's scriptlets run for real too (rpm -i / rpm -e in the booted container)
    "rpm",
)


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


def cached_root_tarball() -> str:
    """The path of the cached root tarball for the current package list (may not exist yet)."""
    digest = hashlib.sha256(" ".join(packages()).encode()).hexdigest()[:12]
    return os.path.join(CACHE_DIR, f"{SUITE}-root-{digest}.tar")


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


def host_mirror() -> Optional[str]:
    """The URI of the host's apt source that serves SUITE itself (not -security/-updates)."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for uri, suites in _deb822_uris(open(path).read()):
            if SUITE in suites:
                return uri
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        if os.path.exists(path):
            for uri, suites in _one_line_uris(open(path).read()):
                if SUITE in suites:
                    return uri
    return None


def build_root_tarball(target: str) -> None:
    """Run debootstrap into a scratch dir and pack it as ``target`` (written via rename)."""
    mirror = host_mirror()
    if mirror is None:
        raise RuntimeError(
            f"no apt source for {SUITE!r} in /etc/apt/sources.list*: add one so debootstrap "
            "has a mirror to read")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    work = tempfile.mkdtemp(prefix="debroot-", dir=os.path.dirname(target))
    try:
        root = os.path.join(work, "root")
        argv = ["debootstrap", "--variant=minbase", "--include=" + ",".join(packages()),
                SUITE, root, mirror]
        LOG.info("building the test root: %s", " ".join(argv))
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap failed (exit {done.returncode}):\n"
                               f"{done.stdout[-3000:]}{_debootstrap_log(root)}")
        _prepare_root(root)
        partial = target + ".partial"
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", partial, "."],
                       check=True)
        os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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


def ensure_root_tarball() -> str:
    """The cached root tarball, built first if there is none yet."""
    target = cached_root_tarball()
    if not os.path.exists(target):
        build_root_tarball(target)
    return target


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(ensure_root_tarball())
    sys.exit(0)
