"""A mixed fleet: multusd's shim against upstream's Go daemon (no /readyz, 404) works at once."""

from __future__ import annotations

import json
import os

import pytest

from harness import call_shim, shim_bound, shim_conf
from testlib import wait_for
from upstreamd import UpstreamDaemon

RESULT = {"cniVersion": "1.0.0",
          "interfaces": [{"name": "eth0", "mac": "0a:58:0a:80:00:05", "sandbox": "/run/netns/x"}],
          "ips": [{"address": "10.128.0.5/23", "gateway": "10.128.0.1", "interface": 0}]}


@pytest.fixture
def upstream(tmp_path):
    daemon = UpstreamDaemon(str(tmp_path / "run"), RESULT)
    yield daemon
    daemon.stop()


def test_add_check_del_against_a_daemon_without_readyz(upstream):
    conf = shim_conf(upstream.socket_dir, "1.0.0")
    args = {"container_id": "c0ffee", "netns": "/run/netns/x", "pod": ("default", "web")}

    add = call_shim("ADD", conf, **args)
    assert add.code == 0, add.output
    assert add.output["ips"] == RESULT["ips"]
    # one 404 on /readyz, then /healthz once, then the request: no polling, no 60 s wait
    assert upstream.requests == ["GET /readyz", "GET /healthz", "POST /cni ADD"]

    upstream.requests.clear()
    check = call_shim("CHECK", conf, **args)
    assert check.code == 0, check.output
    assert upstream.requests == ["GET /readyz", "GET /healthz", "POST /cni CHECK"]

    upstream.requests.clear()
    delete = call_shim("DEL", conf, **args)
    assert delete.code == 0, delete.output
    assert upstream.requests == ["GET /healthz", "POST /cni DEL"]

    # the request itself is upstream's wire shape: CNI env and the config bytes
    assert [b["env"]["CNI_COMMAND"] for b in upstream.bodies] == ["ADD", "CHECK", "DEL"]
    assert all(b["config"] == conf and b["env"]["CNI_CONTAINERID"] == "c0ffee"
               for b in upstream.bodies)


def test_add_converts_the_result_to_the_runtime_config_version(upstream):
    add = call_shim("ADD", shim_conf(upstream.socket_dir, "0.4.0"), container_id="beef",
                    netns="/run/netns/x")
    assert add.code == 0, add.output
    assert add.output["cniVersion"] == "0.4.0"
    assert add.output["ips"][0]["address"] == "10.128.0.5/23"


def test_a_del_upstreams_daemon_keeps_failing_is_reported_only_for_the_window(upstream,
                                                                           tmp_path):
    from multusd.core import delmarks

    cni_dir = str(tmp_path / "cni")
    delmarks.publish_window(cni_dir, 2, default=300)  # a multusd ran here before
    conf = shim_conf(upstream.socket_dir, "1.0.0", cniDir=cni_dir)
    args = {"container_id": "c0ffee", "netns": "/run/netns/x", "pod": ("default", "web")}
    upstream.del_error = {"code": 7, "msg": "no IP ranges specified"}
    answers = [call_shim("DEL", conf, **args)]
    assert answers[0].code == 1 and answers[0].output["msg"] == "no IP ranges specified"

    wait_for(lambda: answers.append(call_shim("DEL", conf, **args)) or answers[-1].code == 0,
             2 + shim_bound("DEL"), interval=0.2, what="DEL answered success")  # the window

    assert all(a.code == 1 for a in answers[:-1])
    assert "has passed, so DEL answers success" in answers[-1].stderr
    with open(os.path.join(cni_dir, ".multusd-unreleased", "c0ffee")) as handle:
        mark = json.load(handle)
    assert mark["by"] == "shim" and mark["attempts"] == len(answers)
    assert mark["until"] == mark["firstFailure"] + 2
    assert upstream.requests.count("POST /cni DEL") == len(answers)  # the wire as it was
