"""The built .deb and .rpm, without booting anything: metadata, layout, scriptlets, linters."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest

from pkgbuild import REPO

# shipped here; the maintainer scripts copy them to /opt/cni/bin (and delete only their own copy)
SHIM = "/usr/lib/multusd/bin/multus-shim"
PASSTHRU = "/usr/lib/multusd/bin/passthru"
CONFIG = "/etc/cni/net.d/multus.d/daemon-config.json"
UNITS = ("multusd.socket", "multusd.service", "multusd-socket-guard.path",
         "multusd-socket-guard.service", "multusd-config.path", "multusd-config.timer",
         "multusd-config.service")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def deb_field(deb: str, field: str) -> str:
    return run("dpkg-deb", "-f", deb, field).stdout.strip()


# ---------------------------------------------------------------------------------- .deb
def test_deb_metadata_declares_the_runtime_dependencies(packages):
    deb = packages["deb"]
    assert deb_field(deb, "Package") == "multusd"
    assert deb_field(deb, "Version") == packages["version"] + "-1"
    assert deb_field(deb, "Architecture") == "all"
    depends = [d.strip() for d in deb_field(deb, "Depends").split(",")]
    assert depends == ["python3 (>= 3.9)", "python3-systemd", "python3-pyroute2",
                       "python3-kubernetes (>= 22.6)", "python3-yaml",
                       "python3-prometheus-client"]
    assert deb_field(deb, "Recommends") == "containernetworking-plugins, python3-grpcio"


def test_deb_layout_and_conffile(packages, tmp_path):
    deb = packages["deb"]
    run("dpkg-deb", "-x", deb, str(tmp_path))
    for unit in UNITS:
        assert (tmp_path / "usr/lib/systemd/system" / unit).is_file(), unit
    for exe in ("usr/bin/multusd", SHIM.lstrip("/"), PASSTHRU.lstrip("/")):
        mode = os.stat(tmp_path / exe).st_mode
        assert stat.S_IMODE(mode) == 0o755, exe
        assert (tmp_path / exe).read_text().startswith("#!/usr/bin/python3"), exe
    assert (tmp_path / "usr/lib/multusd/multusd/__main__.py").is_file()
    assert (tmp_path / "usr/lib/multusd/multusd/wire/shim.py").is_file()
    assert (tmp_path / "usr/lib/multusd/multusd/tools/doctor.py").is_file()
    completion = tmp_path / "usr/share/bash-completion/completions/multusd"
    assert "complete -o filenames -F _multusd multusd" in completion.read_text()
    run("bash", "-n", str(completion))
    import yaml  # python3-yaml, a dependency of python3-kubernetes

    rbac = list(yaml.safe_load_all((tmp_path / "usr/share/multusd/rbac.yaml").read_text()))
    assert [doc["kind"] for doc in rbac] == ["ClusterRole", "ClusterRoleBinding"]
    # least privilege: the Node authorizer grants the pod verbs, the file adds NAD reads only
    assert {(group, resource, verb) for rule in rbac[0]["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]} >= {
        ("k8s.cni.cncf.io", "network-attachment-definitions", verb)
        for verb in ("get", "list", "watch")}
    assert not any(group == "" for rule in rbac[0]["rules"] for group in rule["apiGroups"])
    assert rbac[1]["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                    "name": "system:nodes"}]
    crd = yaml.safe_load((tmp_path / "usr/share/multusd/"
                          "network-attachment-definition-crd.yaml").read_text())
    assert crd["metadata"]["name"] == "network-attachment-definitions.k8s.cni.cncf.io"
    assert crd["spec"]["names"]["kind"] == "NetworkAttachmentDefinition"
    assert not list(tmp_path.rglob("__pycache__")), "byte-code must not be shipped"
    assert not (tmp_path / "opt").exists(), "nothing is shipped in /opt: postinst copies it"
    installed = json.loads((tmp_path / CONFIG.lstrip("/")).read_text())
    assert installed == json.loads(open(os.path.join(REPO, "etc/daemon-config.json")).read())
    control = tmp_path / "DEBIAN"
    run("dpkg-deb", "-e", deb, str(control))
    assert (control / "conffiles").read_text().split() == [CONFIG]


def test_deb_scripts_restart_the_service_never_the_socket(packages, tmp_path):
    run("dpkg-deb", "-e", packages["deb"], str(tmp_path))
    postinst = (tmp_path / "postinst").read_text()
    prerm = (tmp_path / "prerm").read_text()
    postrm = (tmp_path / "postrm").read_text()
    assert "try-restart multusd.service" in postinst
    assert "restart multusd.socket" not in postinst
    assert "install_cni_plugin multus-shim" in postinst
    # an upgrade stops nothing; only "remove" stops units and deletes 00-multus.conf
    assert "multusd generate-config --remove" in prerm
    assert "multusd socket-check --remove-dead" in prerm
    assert "remove_cni_plugin multus-shim" in prerm
    # the pods' records survive remove; purge deletes them only when there are none
    remove_branch = postrm.split("    remove)\n")[1].split(";;")[0]
    assert "/var/lib/cni/multus" not in remove_branch and "CNI_DIR" not in remove_branch
    assert 'rm -rf "$CNI_DIR"' in postrm.split("purge)")[-1]
    assert "rm -rf /run/multusd-kubeconfig-0" in postrm
    # Debian's convention for a private directory's byte-code, as dh_python3 writes it
    assert "py3compile -p multusd /usr/lib/multusd" in postinst
    assert "py3clean -p multusd" in prerm
    for name in ("postinst", "prerm", "postrm"):
        run("sh", "-n", str(tmp_path / name))


def test_deb_is_lintian_clean(packages):
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed")
    done = run("lintian", "--fail-on", "error", packages["deb"], check=False)
    errors = [line for line in done.stdout.splitlines() if line.startswith("E:")]
    assert errors == [] and done.returncode == 0, done.stdout


# ---------------------------------------------------------------------------------- .rpm
def rpm_query(rpm: str, *args: str) -> str:
    return run("rpm", "-qp", *args, rpm).stdout


def test_rpm_info_and_requires(packages):
    rpm = packages["rpm"]
    info = run("rpm", "-qip", rpm).stdout
    assert "Name        : multusd" in info
    assert f"Version     : {packages['version']}" in info
    assert "Architecture: noarch" in info
    requires = rpm_query(rpm, "--requires").splitlines()
    for name in ("python3-systemd", "python3-pyroute2", "python3-kubernetes >= 22.6",
                 "python3-pyyaml", "python3-prometheus_client"):
        assert name in requires, requires
    assert "python3 >= 3.9" in requires
    assert rpm_query(rpm, "--recommends").split() == ["containernetworking-plugins", "python3-grpcio"]


def test_rpm_file_list_and_noreplace_config(packages):
    rpm = packages["rpm"]
    files = rpm_query(rpm, "-l").split()
    for path in (SHIM, PASSTHRU, "/usr/bin/multusd", CONFIG, "/usr/lib/multusd/multusd/daemon/server.py",
                 *("/usr/lib/systemd/system/" + unit for unit in UNITS)):
        assert path in files, path
    flags = dict(line.split(" ", 1) for line in
                 rpm_query(rpm, "--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]").splitlines())
    assert flags[CONFIG] == "cn", "daemon-config.json must be %config(noreplace)"


def test_rpm_scriptlets_follow_the_systemd_macros(packages):
    """%systemd_post (preset on first install), %systemd_preun (disable --now on erase),
    %systemd_postun_with_restart (try-restart on upgrade), as Fedora's macros expand them."""
    scripts = rpm_query(packages["rpm"], "--scripts")
    post = scripts.split("postinstall scriptlet")[1].split("scriptlet")[0]
    first_install = post.split('if [ "$1" -eq 1 ]; then', 1)[1].split("fi", 1)[0]
    assert "systemctl --no-reload preset $UNITS" in first_install
    assert "systemctl enable" not in post and "enable --now" not in post, \
        "a preset decides what is enabled"
    assert "systemctl try-restart" not in post, "an upgrade restarts in %postun"
    preun = scripts.split("preuninstall scriptlet")[1].split("scriptlet")[0]
    erase = preun.split('if [ "$1" -eq 0 ]; then', 1)[1]
    assert erase.count("systemctl --no-reload disable --now") == 2
    for unit in UNITS:
        assert unit in erase, unit
    assert "multusd generate-config --remove" in erase
    assert "multusd socket-check --remove-dead" in erase
    postun = scripts.split("postuninstall scriptlet")[1].split("scriptlet")[0]
    upgrade = postun.split('if [ "$1" -ge 1 ]; then', 1)[1].split("fi", 1)[0]
    assert upgrade.strip() == "systemctl try-restart multusd.service >/dev/null 2>&1 || :"
    assert "multusd.socket" not in postun, "an upgrade never touches the socket"
    assert "rm -rf /var/lib/cni/multus" not in postun, "erase keeps the pods' records"
    posttrans = scripts.split("posttrans scriptlet")[1].split("scriptlet")[0]
    assert "/opt/cni/bin/$name" in posttrans


def test_rpm_ships_a_preset_and_its_byte_code(packages, tmp_path):
    rpm = packages["rpm"]
    files = rpm_query(rpm, "-l").split()
    preset = "/usr/lib/systemd/system-preset/80-multusd.preset"
    assert preset in files
    sources = [f for f in files if f.startswith("/usr/lib/multusd/") and f.endswith(".py")]
    for source in sources:
        folder, name = os.path.split(source)
        assert [f for f in files if f.startswith(f"{folder}/__pycache__/{name[:-3]}.cpython-")
                and f.endswith(".pyc")], f"no byte-code for {source}"
    run("sh", "-c", f"cd {tmp_path} && rpm2cpio {rpm} | cpio -idm --quiet")
    enabled = [line.split()[1] for line in (tmp_path / preset.lstrip("/")).read_text()
               .splitlines() if line.startswith("enable ")]
    assert sorted(enabled) == sorted(u for u in UNITS if u not in (
        "multusd.service", "multusd-socket-guard.service"))
    # the byte-code is checked against the source's hash (an mtime set by rpm cannot make it
    # stale), and names the installed path in tracebacks
    pyc = tmp_path / "usr/lib/multusd/multusd/__pycache__"
    first = sorted(pyc.iterdir())[0].read_bytes()
    assert int.from_bytes(first[4:8], "little") == 0b11, "not a checked hash-based .pyc"
    assert b"/usr/lib/multusd/multusd/" in first


def test_rpm_installs_into_a_root(packages, tmp_path):
    root = tmp_path / "root"
    run("rpm", "--root", str(root), "--initdb")
    run("rpm", "--root", str(root), "--nodeps", "--noscripts", "-i", packages["rpm"])
    assert os.access(root / SHIM.lstrip("/"), os.X_OK)
    assert not (root / "opt/cni/bin/multus-shim").exists()  # %posttrans copies it (--noscripts)
    assert os.access(root / "usr/bin/multusd", os.X_OK)
    assert json.loads((root / CONFIG.lstrip("/")).read_text())["socketDir"] == "/run/multus/"
    assert run("rpm", "--root", str(root), "-q", "multusd").stdout.startswith("multusd-")
    for unit in UNITS:
        assert (root / "usr/lib/systemd/system" / unit).is_file(), unit


def test_rpm_is_rpmlint_clean(packages):
    if shutil.which("rpmlint") is None:
        pytest.skip("rpmlint is not installed (Debian package rpmlint)")
    done = run("rpmlint", "-c", os.path.join(REPO, "packaging/rpmlint.toml"),
               packages["rpm"], check=False)
    assert " 0 errors" in done.stdout and done.returncode == 0, done.stdout
