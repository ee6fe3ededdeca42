"""multusd.core.unreleased: a failed DEL recorded, reported for its window, then unreleased."""

from __future__ import annotations

import json
import logging
import os

import pytest

import multusd
from multusd import store
from multusd.core import delmarks, markadoption, unreleased
from multusd.errors import MultusError
from multusd.wire import delwindow
from harness import events_bound, watch_bound
from failingdel import BOOT, CONF, FAILED, del_request, write_records
from testlib import wait_for

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def test_the_default_window_ends_before_a_kubelets_first_retry():
    # a kubelet retries a failed KillPodSandbox 10-15 s after it failed: the first retry gets
    # success, so that a pod deleted while multusd is down leaves the API within 30 s
    assert 1 <= delwindow.DEFAULT_WINDOW <= 10


def test_a_failed_del_is_reported_for_the_window_then_unreleased(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)

    first = unreleased.record(cni_dir, req, FAILED, "msg 1", window=60, now=1000.0)
    second = unreleased.record(cni_dir, req, FAILED, "msg 2", window=60, now=1030.0)

    assert (first.until, first.attempts, first.by) == (1060.0, 1, "daemon")
    assert (second.first_failure, second.last_failure, second.until, second.attempts) == \
        (1000.0, 1030.0, 1060.0, 2)
    assert second.state(1059.0) == delmarks.REPORTING
    assert second.state(1060.0) == delmarks.UNRELEASED
    assert delmarks.read(cni_dir, "c0ffee") == second
    assert second.pod == "default/web" and second.error == "msg 2"
    assert second.what_failed() == "net1 (default/vendor): plugin gone"
    assert second.request["env"] == {k: v for k, v in req.env.items() if k != "PATH"}
    assert second.request["config"] == CONF.decode()


def test_a_wall_clock_step_changes_no_window_within_a_boot(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)
    mark = unreleased.record(cni_dir, req, FAILED, "m", window=10, now=(1000.0, BOOT, 50.0))

    assert (mark.until, mark.boot_id, mark.until_boot) == (1010.0, BOOT, 60.0)
    three_days = 3 * 86400
    # the wall clock set back three days: the window still ends 10 s later on the boot clock
    assert mark.state((1005.0 - three_days, BOOT, 55.0)) == delmarks.REPORTING
    assert mark.state((1010.0 - three_days, BOOT, 60.0)) == delmarks.UNRELEASED
    # and set forward: it does not end early either
    assert mark.state((1005.0 + three_days, BOOT, 55.0)) == delmarks.REPORTING
    again = unreleased.record(cni_dir, req, FAILED, "m", window=10,
                              now=(1005.0 - three_days, BOOT, 55.0))
    assert (again.first_failure, again.until_boot) == (1000.0, 60.0)  # counted from the first
    longer = unreleased.record(cni_dir, req, FAILED, "m", window=30, now=(0.0, BOOT, 56.0))
    assert longer.until_boot == 80.0  # a window changed since: from the first failure still


def test_across_a_reboot_the_wall_clock_counts_one_window_at_most(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)
    unreleased.record(cni_dir, req, FAILED, "m", window=10, now=(1000.0, BOOT, 50.0))
    other = "3d0f7a52-0000-4000-8000-000000000002"
    mark = delmarks.read(cni_dir, "c0ffee")

    assert mark.state((1011.0, other, 3.0)) == delmarks.UNRELEASED  # the wall clock: over
    back = (1000.0 - 86400, other, 3.0)  # a clock a day behind: never a day of failing DELs
    assert 0 < mark.ends_in(back) <= 10
    anchored = unreleased.record(cni_dir, req, FAILED, "m", window=10, now=back)
    assert (anchored.boot_id, anchored.until_boot) == (other, 13.0)  # this boot's clock now
    assert anchored.state((1000.0 - 86400, other, 13.0)) == delmarks.UNRELEASED


def test_a_mark_without_an_end_has_ended(tmp_path):
    assert multusd.window_left({}, (5.0, BOOT, 5.0)) == 0.0
    assert multusd.window_left({"until": 10.0}, 4.0) == 6.0
    assert multusd.window_left({"until": 10.0, "window": 2}, 4.0) == 2.0


def test_unreleased_are_marks_past_their_window_whose_sandbox_has_records(tmp_path):
    cni_dir = str(tmp_path)
    for cid in ("held", "released", "young"):
        unreleased.record(cni_dir, del_request(cni_dir, cid), FAILED, "m", window=1,
                          now=1.0 if cid != "young" else 4e9)
    write_records(cni_dir, "held")
    write_records(cni_dir, "young")
    os.makedirs(os.path.join(cni_dir, "results"))
    with open(os.path.join(cni_dir, "results", "net-a-released-eth0"), "w") as handle:
        handle.write("{}")

    assert sorted(m.container_id for m in unreleased.unreleased([cni_dir])) == ["held", "released"]
    os.unlink(os.path.join(cni_dir, "results", "net-a-released-eth0"))
    assert [m.container_id for m in unreleased.unreleased([cni_dir])] == ["held"]
    assert unreleased.count_unreleased([cni_dir]) == 1
    assert markadoption.tidy([cni_dir]).dropped == ("released",)
    assert sorted(delmarks.read_all(cni_dir)) == ["held", "young"]
    assert delmarks.clear(cni_dir, "held") and not delmarks.clear(cni_dir, "held")
    assert unreleased.count_unreleased([str(tmp_path / "absent")]) == 0


def test_a_mark_that_can_be_written_nowhere_leaves_the_delegates_error(tmp_path, caplog):
    cni_dir = str(tmp_path / "cni")
    os.makedirs(cni_dir)
    (tmp_path / "cni" / ".multusd-unreleased").write_text("in the way")
    (tmp_path / "run").write_text("and the socket's directory is no directory")
    spare = delmarks.spare_marks_dir(str(tmp_path / "run"))

    with pytest.raises(MultusError) as raised:
        unreleased.report(cni_dir, del_request(cni_dir), FAILED, "DEL failed: plugin gone",
                          window=10, kube=None, log=LOG, spare=spare)

    assert raised.value.msg.startswith("DEL failed: plugin gone (multusd cannot record this "
                                       "failure: cannot write ")
    assert any("cannot be recorded" in r.getMessage() for r in caplog.records)


@pytest.fixture
def client(kube_api):
    """Our Kubernetes client, its caches in sync with the stand-in API server."""
    from multusd.kube.client import KubeClient

    made = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    made.start()
    assert made.wait_synced(watch_bound()), made.last_error
    yield made
    made.stop()


def test_a_pod_gone_from_the_api_changes_no_window(tmp_path, kube_api, client):
    cni_dir = str(tmp_path)
    uid = kube_api.add_pod("default", "web")["metadata"]["uid"]
    wait_for(lambda: client.cached_pod("default", "web") is not None, watch_bound(),
             what="the pod cached")
    kube_api.delete_pod("default", "web")  # `kubectl delete --force`
    wait_for(lambda: client.cached_pod("default", "web") is None, watch_bound(),
             what="the deletion cached")

    with pytest.raises(MultusError) as raised:
        unreleased.report(cni_dir, del_request(cni_dir, uid=uid), FAILED, "DEL failed",
                          window=10, kube=client, log=LOG)

    mark = delmarks.read(cni_dir, "c0ffee")
    assert mark.until == mark.first_failure + 10  # the window, not a grace
    assert "gone" not in raised.value.msg


def test_report_raises_within_the_window_and_announces_once_after_it(tmp_path, caplog,
                                                                     kube_api, client):
    cni_dir = str(tmp_path)
    uid = kube_api.add_pod("default", "web")["metadata"]["uid"]
    wait_for(lambda: client.cached_pod("default", "web") is not None, watch_bound(),
             what="the pod cached")
    req = del_request(cni_dir, uid=uid)
    with pytest.raises(MultusError) as raised:
        unreleased.report(cni_dir, req, FAILED, "DEL failed", window=3600, kube=client, log=LOG)
    assert raised.value.msg.startswith("DEL failed. This is reported until ")
    assert "deleteRetryWindow 3600s after the first failure" in raised.value.msg
    path = delmarks.mark_path(cni_dir, "c0ffee")
    mark = json.loads(open(path).read())
    mark["untilBoot"] -= 3600  # the hour has passed
    store.atomic_write(path, json.dumps(mark).encode())

    with caplog.at_level(logging.INFO):
        unreleased.report(cni_dir, req, FAILED, "DEL failed", window=3600, kube=client, log=LOG)
        unreleased.report(cni_dir, req, FAILED, "DEL failed", window=3600, kube=client, log=LOG)

    [event] = wait_for(lambda: [e for e in kube_api.events
                                if e.get("reason") == "NetworkNotReleased"],
                       events_bound(1, client.request_timeout), what="the Event")
    assert event["type"] == "Warning" and event["involvedObject"]["uid"] == uid
    assert "net1 (default/vendor): plugin gone" in event["message"]
    assert "`multusd gc`" in event["message"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.name == "test"]
    assert len(warnings) == 1 and "DEL of sandbox c0ffee (default/web) has failed" in warnings[0]
    assert delmarks.read(cni_dir, "c0ffee").announced
    assert delmarks.read(cni_dir, "c0ffee").attempts == 3
    client.stop()  # the queued events are sent before it returns
    assert len([e for e in kube_api.events if e.get("reason") == "NetworkNotReleased"]) == 1
