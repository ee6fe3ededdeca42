"""multusd.daemon.dynnetworks: pods delivered by the watch, reconciled in their sandbox's lane,
once per change, retried on a bounded policy; real lanes, the daemon's Multus on stub delegates
in a real namespace, the stand-in API server."""

from __future__ import annotations

import threading

import pytest

from multusd.daemon.dynnetworks import DynamicNetworks, RetryPolicy
from multusd.kube.retries import BackoffPolicy
from multusd.daemon.lanes import Job, Lanes
from multusd.kube.objects import pod_from_object

from harness import watch_bound
from hotplugnode import Node
from testlib import wait_for

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


RECONCILE_TIMEOUT = 30.0  # each reconciliation's deadline here
POLICY = RetryPolicy(curve=BackoffPolicy(0.01, 0.02, jitter=0.0), attempts=3)
# the longest a pod's delivery takes to be dealt with: every attempt within its deadline, and
# the waits between them
DEALT_WITH = POLICY.attempts * (RECONCILE_TIMEOUT + POLICY.curve.cap * (1 + POLICY.curve.jitter))


@pytest.fixture
def node(tmp_path, kube_api, netns):
    made = Node(tmp_path, kube_api, netns)
    yield made
    made.client.stop()


@pytest.fixture
def lanes():
    made = Lanes(lambda job: None, workers=2, fast_workers=1, max_queued=16)
    yield made
    made.close()


@pytest.fixture
def dynamic(node, lanes):
    made = DynamicNetworks(node.multus, request_timeout=RECONCILE_TIMEOUT, policy=POLICY)
    made.start(lanes)
    yield made
    made.stop()


def running(node: Node, networks=None, **changes):
    """The pod as the watch delivers it once the kubelet reports it Running."""
    if networks is not None:
        node.api.update_pod("default", "web", annotations={
            "k8s.v1.cni.cncf.io/networks": networks})
    return pod_from_object(node.api.update_pod("default", "web", phase="Running", **changes))


def settled(dynamic: DynamicNetworks) -> dict:
    return wait_for(lambda: (lambda s: s if s["pending"] == 0 and not s["retrying"] else None)(
        dynamic.status()), DEALT_WITH, what="every delivery dealt with")


@pytest.mark.parametrize("failures,low,high", [(1, 1.0, 2.0), (2, 2.0, 4.0), (3, 4.0, 8.0),
                                               (7, 60.0, 120.0)])
def test_the_retry_policy_doubles_to_its_cap_with_jitter(failures, low, high):
    policy = RetryPolicy()
    assert policy.delay(failures, rand=lambda: 0.0) == low
    assert policy.delay(failures, rand=lambda: 0.999) == pytest.approx(high, rel=0.01)


def test_the_retry_policy_gives_up_after_its_attempts():
    assert RetryPolicy(attempts=3).delay(2) is not None
    assert RetryPolicy(attempts=3).delay(3) is None


def test_a_running_pods_changed_selection_is_reconciled_once(node, dynamic):
    node.nad("b", "hot0")
    node.attach()
    pod = running(node, "b@hot0")

    for _ in range(3):  # a watch may deliver a pod again (relist, status updates)
        dynamic.pod_changed(pod)

    wait_for(lambda: dynamic.counts()["changed"] == 1, DEALT_WITH, what="the reconciliation")
    state = settled(dynamic)
    assert state["podsChecked"] == 1
    assert sum(state["reconciliations"].values()) == 1
    assert node.calls().count(("ADD", "b", "hot0")) == 1
    assert node.recorded()[-1] == ("default/b", "hot0")


def test_it_waits_for_the_sandboxs_other_request_in_its_lane(node, dynamic, lanes):
    node.nad("b", "hot0")
    node.attach()
    release, seen = threading.Event(), []

    def other_request(job) -> None:  # e.g. the runtime's CHECK of the same sandbox
        release.wait(20)
        seen.append(("ADD", "b", "hot0") in node.calls())

    assert lanes.submit(Job(None, "", "", b"", float("inf"), "CHECK", node.cid,
                            task=other_request))
    dynamic.pod_changed(running(node, "b@hot0"))
    wait_for(lambda: dynamic.status()["podsChecked"] == 1, DEALT_WITH, what="the pod looked at")
    release.set()
    wait_for(lambda: dynamic.counts()["changed"] == 1, DEALT_WITH, what="the reconciliation")
    assert seen == [False]  # it had not run beside the other request


def test_a_pod_that_is_not_running_or_terminating_is_not_looked_at(node, dynamic):
    node.nad("b", "hot0")
    node.attach()
    node.api.update_pod("default", "web", annotations={"k8s.v1.cni.cncf.io/networks": "b@hot0"})
    dynamic.pod_changed(node.pod())  # Pending
    dynamic.pod_changed(running(node, terminating=True))
    assert settled(dynamic)["podsChecked"] == 0
    assert ("ADD", "b", "hot0") not in node.calls()


def test_a_failure_is_retried_then_given_up_until_the_selection_changes(node, dynamic):
    node.nad("b", "hot0", failOn="ADD", error=ERROR)
    node.nad("c", "hot1")
    node.attach()

    dynamic.pod_changed(running(node, "b@hot0"))

    wait_for(lambda: dynamic.counts()["failed"] == 3, DEALT_WITH, what="three attempts")
    settled(dynamic)
    assert dynamic.counts()["failed"] == 3  # given up: no fourth
    assert node.calls().count(("ADD", "b", "hot0")) == 3

    dynamic.pod_changed(running(node, "c@hot1"))
    wait_for(lambda: dynamic.counts()["changed"] == 1, DEALT_WITH,
             what="the new selection applied")
    assert node.recorded()[-1] == ("default/c", "hot1")


def test_a_pod_the_cache_no_longer_holds_is_forgotten(node, lanes):
    now = [1000.0]
    dynamic = DynamicNetworks(node.multus, request_timeout=30,
                              clock=lambda: now[0])
    node.attach()
    dynamic.pod_changed(running(node))
    node.api.delete_pod("default", "web")
    wait_for(lambda: node.client.cached_pod("default", "web") is None, watch_bound(),
             what="the delete")
    with dynamic._cond:
        dynamic._forget_gone()
        assert dynamic._pods  # delivered just now
        now[0] += 61.0
        dynamic._forget_gone()
        assert not dynamic._pods


def test_a_look_that_fails_is_retried_with_the_backoff_said_once_never_a_loop(node, lanes,
                                                                              caplog):
    node.nad("b", "hot0")
    node.attach()
    node.drop_record()  # an earlier multusd's sandbox...
    node.configure(delegates=None)  # ...and settings that do not load: nothing to judge it by
    dynamic = DynamicNetworks(node.multus, request_timeout=RECONCILE_TIMEOUT, policy=POLICY)
    dynamic.start(lanes)
    try:
        dynamic.pod_changed(running(node, "b@hot0"))
        wait_for(lambda: dynamic.status()["podsChecked"] >= 3, DEALT_WITH, what="three looks")
        status = settled(dynamic)
    finally:
        dynamic.stop()
    assert status["podsChecked"] == 3  # on the backoff, then given up: no fourth, no loop
    assert sum(status["reconciliations"].values()) == 0
    assert ("ADD", "b", "hot0") not in node.calls()
    said = [r for r in caplog.records if "cannot be established" in r.getMessage()]
    assert len(said) == 1
