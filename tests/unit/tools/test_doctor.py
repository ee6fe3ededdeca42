"""multusd.tools.doctor: the node-local checks' verdicts and fixes (config, socket, kubeconfig,
readiness, stale and unreleased sandboxes, the runtime's config), and that one check's failure
hides no other.

Records written by the daemon's own ADD and DEL (tests/toolnode.py: stub delegates in real
namespaces); the socket is a real unix socket. The checks that ask the API server, and the
whole tool as a process on a node with real plugins, are tests/integration/test_tools.py's.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Dict

import pytest

from multusd.config import generateconfig
from multusd.errors import MultusError
from multusd.tools import common, doctor
from toolnode import ToolNode, netns_gone

pytestmark = pytest.mark.privileged

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


def delegates(node: ToolNode) -> list:
    """"cluster", and "stuck", whose DEL fails for good."""
    return [node.stub("cluster"),
            node.stub("stuck", failDelUnless="/nonexistent/never", error=ERROR)]


@pytest.fixture
def make_node(tmp_path, make_netns):
    def make(**daemon: Any) -> ToolNode:
        return ToolNode(tmp_path, make_netns, delegates, **daemon)
    return make


def checked(node: ToolNode, name: str) -> doctor.Check:
    """A fresh doctor's check ``name`` (after the config check it needs)."""
    doc = doctor.Doctor(node.config_path)
    assert doc.check_config().status in (doctor.OK, doctor.WARN)
    return getattr(doc, f"check_{name}")()


def by_name(checks: list) -> Dict[str, doctor.Check]:
    return {c.name: c for c in checks}


# ---- the config, and checks that cannot run ----------------------------------------------------

def test_a_config_that_does_not_parse_is_the_one_check_and_names_the_file(tmp_path, capsys):
    path = tmp_path / "daemon-config.json"
    path.write_text('{"cniVersion": "1.0.0",')
    checks = doctor.Doctor(str(path)).run()
    assert [(c.name, c.status) for c in checks] == [("config", doctor.FAIL)]
    assert str(path) in checks[0].fix and "the other checks need it" in checks[0].fix
    assert doctor.run(str(path), as_json=True) == common.EXIT_PROBLEM
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and document["checks"][0]["ok"] is False


def test_a_config_warning_is_a_warning_not_a_failure(make_node):
    node = make_node(enablePprof=True)  # upstream's Go profiling: accepted, ignored, said
    check = doctor.Doctor(node.config_path).check_config()
    assert check.status == doctor.WARN and check.verdict.endswith("is valid (1 warning(s))")
    assert check.details == ["enablePprof: Go profiling does not exist in multusd; ignored"]


def test_a_check_that_breaks_is_a_failure_of_its_own_and_the_others_still_run(make_node):
    node = make_node()
    with open(node.cni_dir, "w") as handle:  # cniDir is a file: no record can be listed
        handle.write("x")
    checks = doctor.Doctor(node.config_path).run()
    assert [c.name for c in checks] == [
        "config", "socket", "service", "kubeconfig", "api", "permissions", "nad-api", "node",
        "dra", "plugins", "00-multus.conf", "readiness", "stale", "unreleased"]
    broken = by_name(checks)
    for name in ("stale", "unreleased"):
        assert broken[name].status == doctor.FAIL
        assert broken[name].verdict.startswith("the check itself failed: IOFailure: cannot "
                                               f"list the CNI cache {node.cni_dir}/"), name
    assert broken["readiness"].status == doctor.SKIP


# ---- the socket --------------------------------------------------------------------------------

def test_the_socket_missing_a_file_in_its_place_and_loose_modes_are_each_named(make_node):
    node = make_node()
    doc = doctor.Doctor(node.config_path)
    doc.check_config()
    path = doc.config.socket_path
    check = doc.check_socket()
    assert check.status == doctor.FAIL and "no socket at" in check.verdict
    assert "systemctl enable --now multusd.socket" in check.fix

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    open(path, "w").close()
    check = doc.check_socket()
    assert check.status == doctor.FAIL and check.verdict == f"{path} is not a socket"
    os.unlink(path)

    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(path)
        os.chmod(path, 0o666)
        os.chmod(os.path.dirname(path), 0o755)
        check = doc.check_socket()
        assert check.status == doctor.FAIL
        assert f"{path} has mode 0666, not 0600" in check.verdict
        assert "has mode 0755, not 0700" in check.verdict
        assert "other users could reach the daemon" in check.verdict
        assert "do not chmod it by hand" in check.fix
        os.chmod(path, 0o600)
        os.chmod(os.path.dirname(path), 0o700)
        assert doc.check_socket().status == doctor.OK
    finally:
        listener.close()
        os.unlink(path)


# ---- the kubeconfig ----------------------------------------------------------------------------

def test_no_kubeconfig_is_skipped_and_says_nads_are_off(make_node):
    check = checked(make_node(), "kubeconfig")
    assert check.status == doctor.SKIP and "without Kubernetes" in check.verdict


def test_a_missing_kubeconfig_names_the_key_to_fix(make_node, tmp_path):
    missing = str(tmp_path / "nowhere.conf")
    check = checked(make_node(kubeconfig=missing), "kubeconfig")
    assert check.status == doctor.FAIL and check.verdict == f"kubeconfig {missing} is not readable"
    assert '"kubeconfig" in daemon-config.json' in check.fix


def test_a_kubeconfig_that_cannot_be_used_says_why_and_the_api_checks_are_skipped(make_node,
                                                                                  tmp_path):
    kubeconfig = tmp_path / "broken.conf"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    node = make_node(kubeconfig=str(kubeconfig))
    checks = by_name(doctor.Doctor(node.config_path).run())
    assert checks["kubeconfig"].status == doctor.FAIL
    assert "current-context" in checks["kubeconfig"].verdict
    assert checks["kubeconfig"].fix == "fix the kubeconfig"
    for name in ("api", "permissions", "nad-api", "node", "dra"):
        assert checks[name].status == doctor.SKIP, name


# ---- readiness ---------------------------------------------------------------------------------

def test_readiness_is_skipped_unset_failing_absent_and_ok_present(make_node, tmp_path):
    assert checked(make_node(), "readiness").status == doctor.SKIP
    indicator = tmp_path / "ready"
    node = make_node(readinessindicatorfile=str(indicator))
    check = checked(node, "readiness")
    assert check.status == doctor.FAIL
    assert check.verdict == (f"readiness indicator {indicator} is absent: every ADD waits for "
                             "it and then fails")
    assert "readinessindicatorfile" in check.fix
    indicator.write_text("")
    assert checked(node, "readiness").status == doctor.OK


# ---- stale and unreleased sandboxes ------------------------------------------------------------

def delete(node: ToolNode, cid: str, netns: str) -> bool:
    """The daemon's DEL; whether it answered success."""
    try:
        node.delete(cid, netns)
    except MultusError:
        return False
    return True


def test_a_failing_del_warns_and_past_its_window_fails_naming_gc(make_node):
    node = make_node()  # the default deleteRetryWindow: minutes
    assert checked(node, "unreleased").status == doctor.OK
    netns = node.attach("fail0001")
    assert not delete(node, "fail0001", netns)  # within the window: the runtime retries
    check = checked(node, "unreleased")
    assert check.status == doctor.WARN
    assert check.verdict == "1 sandbox(es) whose DEL is failing (the runtime retries it)"
    assert len(check.details) == 1 and "fail0001" in check.details[0]
    assert "its daemon is down" in check.details[0]

    node = make_node(deleteRetryWindow=0.001)  # the same records, the window now over
    assert delete(node, "fail0001", netns)  # answered success, the sandbox kept
    check = checked(node, "unreleased")
    assert check.status == doctor.FAIL
    assert check.verdict.startswith("1 sandbox(es) could not be released")
    assert "`multusd gc` releases them" in check.fix
    assert checked(node, "stale").status == doctor.OK  # the unreleased check's, not stale's


def test_a_sandbox_whose_netns_is_gone_is_stale_with_what_it_holds(make_node):
    node = make_node()
    node.attach("live0001")
    netns_gone(node.attach("gone0001"))
    check = checked(node, "stale")
    assert check.status == doctor.FAIL
    assert check.verdict.startswith("1 sandbox(es) whose network namespace is gone")
    assert len(check.details) == 1 and "gone0001" in check.details[0]
    assert "`multusd gc --release`" in check.fix


# ---- the runtime's config ----------------------------------------------------------------------

def test_the_runtimes_config_missing_loose_shadowed_or_foreign_is_named(make_node):
    node = make_node()
    check = checked(node, "multus_conf")
    assert check.status == doctor.FAIL and "not written" in check.verdict  # no primary yet
    with open(os.path.join(node.conf_dir, "10-primary.conflist"), "w") as handle:
        json.dump({"cniVersion": "1.0.0", "name": "primary",
                   "plugins": [{"type": "stub-record"}]}, handle)
    check = checked(node, "multus_conf")
    assert check.status == doctor.FAIL and "is missing" in check.verdict
    assert check.fix == common.REGENERATE
    assert generateconfig.run(node.config_path) == 0
    check = checked(node, "multus_conf")
    assert check.status == doctor.OK, check.verdict
    target = os.path.join(node.conf_dir, "00-multus.conf")

    os.chmod(target, 0o644)
    check = checked(node, "multus_conf")
    assert check.status == doctor.FAIL and "mode 0644, not 0600" in check.verdict
    os.chmod(target, 0o600)

    first = os.path.join(node.conf_dir, "00-aaa.conf")
    with open(first, "w") as handle:
        json.dump({"cniVersion": "1.0.0", "name": "x", "type": "bridge"}, handle)
    check = checked(node, "multus_conf")
    assert check.status == doctor.FAIL
    assert "'00-aaa.conf' sorts before it: the runtime uses that one instead" in check.verdict
    assert check.fix.endswith("; move 00-aaa.conf away")
    os.unlink(first)

    with open(target) as handle:
        written = json.load(handle)
    with open(target, "w") as handle:
        json.dump(dict(written, type="multus"), handle)
    check = checked(node, "multus_conf")
    assert check.status == doctor.FAIL
    assert "its type is 'multus', not 'multus-shim'" in check.verdict
