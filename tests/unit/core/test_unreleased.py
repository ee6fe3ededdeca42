"""multusd.core.unreleased: the daemon's records of sandboxes whose DEL failed, and its window."""

from __future__ import annotations

import json
import logging
import os

import pytest

from multusd import store
from multusd.config import daemonconf
from multusd.core import request, unreleased
from multusd.errors import MultusError
from multusd.wire import delwindow
from testlib import wait_for

CONF = b'{"cniVersion":"0.4.0","name":"multus-cni-network","type":"multus-shim"}'
LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def del_request(cni_dir: str, cid: str = "c0ffee", uid: str = "u-1") -> request.CmdArgs:
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": "/run/netns/x",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin", "PATH": "/usr/bin",
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;"
                       f"K8S_POD_UID={uid}"}
    return request.parse(env, CONF, daemonconf.from_dict({"cniDir": cni_dir}))


FAILED = (unreleased.Failure(network="default/vendor", ifname="net1", error="plugin gone"),)


def test_the_same_place_and_window_as_the_shims():
    assert unreleased.mark_dir("/x") == delwindow.marks_dir("/x")
    assert daemonconf.from_dict({}).delete_retry_window == delwindow.DEFAULT_WINDOW


def test_a_failed_del_is_reported_for_the_window_then_unreleased(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)

    first = unreleased.record(cni_dir, req, FAILED, "msg 1", window=60, pod_gone=False,
                              now=1000.0)
    second = unreleased.record(cni_dir, req, FAILED, "msg 2", window=60, pod_gone=False,
                               now=1030.0)

    assert (first.until, first.attempts, first.by) == (1060.0, 1, "daemon")
    assert (second.first_failure, second.last_failure, second.until, second.attempts) == \
        (1000.0, 1030.0, 1060.0, 2)
    assert second.state(1059.0) == unreleased.REPORTING
    assert second.state(1060.0) == unreleased.UNRELEASED
    assert unreleased.read(cni_dir, "c0ffee") == second
    assert second.pod == "default/web" and second.error == "msg 2"
    assert second.what_failed() == "net1 (default/vendor): plugin gone"
    assert second.request["env"] == {k: v for k, v in req.env.items() if k != "PATH"}
    assert second.request["config"] == CONF.decode()


def test_the_shims_first_failure_starts_the_window_and_the_daemon_takes_the_mark_over(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)
    delwindow.note_failure({"cniDir": cni_dir}, dict(req.env), CONF, "not reachable",
                           now=900.0)
    shims = unreleased.read(cni_dir, "c0ffee")
    assert (shims.by, shims.first_failure, shims.until, shims.error) == \
        ("shim", 900.0, 900.0 + delwindow.DEFAULT_WINDOW, "not reachable")
    assert shims.pod == "default/web" and shims.failures == ()

    mark = unreleased.record(cni_dir, req, FAILED, "msg", window=60, pod_gone=False,
                             now=1000.0)

    assert (mark.by, mark.first_failure, mark.until, mark.attempts) == ("daemon", 900.0, 960.0, 2)
    assert delwindow.expired(delwindow.read_mark(unreleased.mark_path(cni_dir, "c0ffee")),
                             now=960.0)


def test_a_pod_gone_from_the_api_shortens_the_window_to_the_grace(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)
    unreleased.record(cni_dir, req, FAILED, "m", window=3600, pod_gone=False, now=1000.0)
    gone = unreleased.record(cni_dir, req, FAILED, "m", window=3600, pod_gone=True, now=2000.0)
    later = unreleased.record(cni_dir, req, FAILED, "m", window=3600, pod_gone=True, now=2010.0)

    assert (gone.pod_gone_since, gone.until) == (2000.0, 2000.0 + unreleased.POD_GONE_GRACE)
    assert (later.pod_gone_since, later.until) == (2000.0, 2030.0)
    short = unreleased.record(cni_dir, del_request(cni_dir, "beef"), FAILED, "m", window=5,
                              pod_gone=True, now=100.0)
    assert short.until == 105.0  # never later than the window itself


def write_records(cni_dir: str, cid: str) -> None:
    store.atomic_write(os.path.join(cni_dir, cid), b"[]")


def test_unreleased_are_marks_past_their_window_whose_sandbox_has_records(tmp_path):
    cni_dir = str(tmp_path)
    for cid in ("held", "released", "young"):
        unreleased.record(cni_dir, del_request(cni_dir, cid), FAILED, "m", window=1,
                          pod_gone=False, now=1.0 if cid != "young" else 4e9)
    write_records(cni_dir, "held")
    write_records(cni_dir, "young")
    os.makedirs(os.path.join(cni_dir, "results"))
    with open(os.path.join(cni_dir, "results", "net-a-released-eth0"), "w") as handle:
        handle.write("{}")

    assert sorted(m.container_id for m in unreleased.unreleased(cni_dir)) == ["held", "released"]
    os.unlink(os.path.join(cni_dir, "results", "net-a-released-eth0"))
    assert [m.container_id for m in unreleased.unreleased(cni_dir)] == ["held"]
    assert unreleased.count_unreleased(cni_dir) == 1
    assert unreleased.prune(cni_dir) == ["released"]
    assert sorted(unreleased.read_all(cni_dir)) == ["held", "young"]
    assert unreleased.clear(cni_dir, "held") and not unreleased.clear(cni_dir, "held")
    assert unreleased.count_unreleased(str(tmp_path / "absent")) == 0


def test_what_is_not_a_mark_is_ignored(tmp_path):
    cni_dir = str(tmp_path)
    directory = unreleased.mark_dir(cni_dir)
    os.makedirs(directory)
    for name, text in ((".settings", '{"deleteRetryWindow": 5}'), ("corrupt", "{"),
                       ("list", "[]"), ("other-id", '{"containerId": "x", "firstFailure": 1}'),
                       ("no-time", '{"containerId": "no-time"}'), ("bad name!", "{}")):
        with open(os.path.join(directory, name), "w") as handle:
            handle.write(text)
    assert unreleased.read_all(cni_dir) == {}
    assert unreleased.read(cni_dir, "../x") is None


def test_the_window_is_published_for_the_shim_only_when_not_the_default(tmp_path):
    cni_dir = str(tmp_path)
    unreleased.publish_window(cni_dir, 300.0, default=300.0)
    assert not os.path.exists(unreleased.mark_dir(cni_dir))  # a healthy node: nothing at all
    unreleased.publish_window(cni_dir, 5.0, default=300.0)
    assert delwindow.window(unreleased.mark_dir(cni_dir)) == 5.0
    unreleased.publish_window(cni_dir, 300.0, default=300.0)
    assert not os.path.exists(unreleased.mark_dir(cni_dir))


@pytest.fixture
def client(kube_api):
    """Our Kubernetes client, its caches in sync with the stand-in API server."""
    from multusd.kube.client import KubeClient

    made = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    made.start()
    assert made.wait_synced(10), made.last_error
    yield made
    made.stop()


def test_a_pod_is_gone_only_when_a_synced_cache_says_so(kube_api, client):
    from multusd.kube.client import KubeClient

    uid = kube_api.add_pod("default", "web")["metadata"]["uid"]
    wait_for(lambda: client.cached_pod("default", "web") is not None, what="the pod cached")
    assert not unreleased.pod_gone(client, "default", "web", uid)
    assert unreleased.pod_gone(client, "default", "web", "another-uid")  # made again since
    assert not unreleased.pod_gone(client, "", "", "")  # not a pod
    assert not unreleased.pod_gone(None, "default", "web", uid)  # no Kubernetes
    kube_api.delete_pod("default", "web")
    wait_for(lambda: client.cached_pod("default", "web") is None, what="the deletion cached")
    assert unreleased.pod_gone(client, "default", "web", uid)
    unsynced = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    assert not unreleased.pod_gone(unsynced, "default", "web", uid)  # cannot be told yet


def test_report_raises_within_the_window_and_announces_once_after_it(tmp_path, caplog,
                                                                     kube_api, client):
    cni_dir = str(tmp_path)
    uid = kube_api.add_pod("default", "web")["metadata"]["uid"]
    wait_for(lambda: client.cached_pod("default", "web") is not None, what="the pod cached")
    req = del_request(cni_dir, uid=uid)
    with pytest.raises(MultusError) as raised:
        unreleased.report(cni_dir, req, FAILED, "DEL failed", window=3600, kube=client, log=LOG)
    assert raised.value.msg.startswith("DEL failed. This is reported until ")
    assert "deleteRetryWindow 3600s after the first failure" in raised.value.msg
    path = unreleased.mark_path(cni_dir, "c0ffee")
    mark = json.loads(open(path).read())
    mark["firstFailure"] -= 3600  # the hour has passed
    store.atomic_write(path, json.dumps(mark).encode())

    with caplog.at_level(logging.INFO):
        unreleased.report(cni_dir, req, FAILED, "DEL failed", window=3600, kube=client, log=LOG)
        unreleased.report(cni_dir, req, FAILED, "DEL failed", window=3600, kube=client, log=LOG)

    [event] = wait_for(lambda: [e for e in kube_api.events
                                if e.get("reason") == "NetworkNotReleased"], what="the Event")
    assert event["type"] == "Warning" and event["involvedObject"]["uid"] == uid
    assert "net1 (default/vendor): plugin gone" in event["message"]
    assert "`multusd gc`" in event["message"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.name == "test"]
    assert len(warnings) == 1 and "DEL of sandbox c0ffee (default/web) has failed" in warnings[0]
    assert unreleased.read(cni_dir, "c0ffee").announced
    assert unreleased.read(cni_dir, "c0ffee").attempts == 3
    client.stop()  # the queued events are sent before it returns
    assert len([e for e in kube_api.events if e.get("reason") == "NetworkNotReleased"]) == 1
