"""multusd.kube.status: the network-status PUT and its retries, and the bounded event sender.

Driven through the stand-in API server (tests/kubeapi.py) over the real transport. The
module is handed its one request function (``send``, what :class:`KubeClient` hands it);
here that function is :class:`Sender`, which sends through the real transport and keeps the
bodies it sent, so a test can read what went on the wire as well as what the server stored.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from typing import Any, List, Optional, Tuple

import pytest

from kubeapi import FakeKubeAPI
from multusd.errors import MultusError, PodNotFound, TryAgainLater
from multusd.kube import status
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.objects import NETWORK_STATUS_ANNOTATION, Pod, pod_from_object
from testlib import wait_for

NS = "default"
STATUS = json.dumps([{"name": "cbr0", "interface": "eth0", "ips": ["10.1.0.5"],
                      "default": True, "dns": {}}], indent=4)
POD_PATH = f"/api/v1/namespaces/{NS}/pods/web"
EVENTS_PATH = f"/api/v1/namespaces/{NS}/events"


class Sender:
    """The JSON request function status.py is given, over a real transport; it records
    (method, path, body) of every call."""

    def __init__(self, config: ClientConfig, timeout: float = 5.0) -> None:
        self.config, self.timeout = config, timeout
        self.calls: List[Tuple[str, str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, *, body: Any = None,
                 deadline: Optional[float] = None, decode: bool = True, action: str = "") -> Any:
        with self._lock:
            self.calls.append((method, path, copy.deepcopy(body)))
        timeout = self.timeout if deadline is None else \
            max(0.05, min(self.timeout, deadline - time.monotonic()))
        response = self.config.transport.request(method, path, body=body, timeout=timeout)
        try:
            return json.loads(response.data) if decode else {}
        finally:
            response.release_conn()

    def verbs(self) -> List[Tuple[str, str]]:
        return [(method, path) for method, path, _ in self.calls]


@pytest.fixture
def configs():
    made: List[ClientConfig] = []

    def make(api: FakeKubeAPI) -> ClientConfig:
        made.append(ClientConfig(api.kubeconfig_path))
        return made[-1]

    yield make
    for config in made:
        config.close()


@pytest.fixture
def sender(kube_api, configs) -> Sender:
    return Sender(configs(kube_api))


def watched(api: FakeKubeAPI, name: str = "web", namespace: str = NS) -> Pod:
    """The pod as a watch delivers it now."""
    return pod_from_object(api.pod(namespace, name))


def write(sender: Sender, pod: Pod, value: str = STATUS, *,
          stopping: Optional[threading.Event] = None, deadline: Optional[float] = None) -> None:
    status.set_network_status(sender, sender.config, pod, value,
                              stopping or threading.Event(), deadline=deadline)


def stored_annotation(api: FakeKubeAPI, name: str = "web") -> Optional[str]:
    return (api.pod(NS, name)["metadata"].get("annotations") or {}).get(NETWORK_STATUS_ANNOTATION)


PUT = ("PUT", POD_PATH + "/status")
GET = ("GET", POD_PATH)


# ---- the network-status write -------------------------------------------------------------

def test_one_put_of_the_watched_copy_guarded_by_its_resource_version(kube_api, sender):
    created = kube_api.add_pod(NS, "web", annotations={"keep": "me"})
    write(sender, watched(kube_api))
    assert sender.verbs() == [PUT]  # no GET first
    body = sender.calls[0][2]
    assert body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert body["metadata"]["uid"] == created["metadata"]["uid"]
    assert body["metadata"]["annotations"] == {"keep": "me", NETWORK_STATUS_ANNOTATION: STATUS}
    assert body["spec"] == created["spec"] and body["status"] == created["status"]
    assert stored_annotation(kube_api) == STATUS


def test_a_list_item_without_kind_is_sent_as_a_v1_pod(kube_api, sender):
    obj = kube_api.add_pod(NS, "web")
    del obj["apiVersion"], obj["kind"]  # what items of a LIST look like
    write(sender, pod_from_object(obj))
    body = sender.calls[0][2]
    assert (body["apiVersion"], body["kind"]) == ("v1", "Pod")
    assert stored_annotation(kube_api) == STATUS


def test_a_stale_copy_gets_409_then_a_fresh_get_and_put_that_keep_what_changed(kube_api,
                                                                               sender):
    kube_api.add_pod(NS, "web", annotations={"keep": "me"})
    pod = watched(kube_api)
    changed = kube_api.update_pod(NS, "web", annotations={"added": "meanwhile"},
                                  phase="Running", labels={"app": "web", "new": "label"})
    write(sender, pod)
    assert sender.verbs() == [PUT, GET, PUT]
    assert sender.calls[0][2]["metadata"]["resourceVersion"] == pod.resource_version
    assert sender.calls[2][2]["metadata"]["resourceVersion"] == \
        changed["metadata"]["resourceVersion"]
    stored = kube_api.pod(NS, "web")
    assert stored["metadata"]["annotations"] == {
        "keep": "me", "added": "meanwhile", NETWORK_STATUS_ANNOTATION: STATUS}
    assert stored["metadata"]["labels"] == {"app": "web", "new": "label"}
    assert stored["status"]["phase"] == "Running"


def test_node_restriction_refusing_a_stale_copy_is_followed_by_a_fresh_one(make_kube_api,
                                                                          configs):
    api = make_kube_api(user="system:node:node-a")  # admission runs before the version check
    api.add_pod(NS, "web", labels={"app": "web"})
    pod = watched(api)
    api.update_pod(NS, "web", labels={"app": "web", "rollout": "2"})
    sender = Sender(configs(api))
    write(sender, pod)
    assert sender.verbs() == [PUT, GET, PUT]
    assert stored_annotation(api) == STATUS
    assert api.pod(NS, "web")["metadata"]["labels"] == {"app": "web", "rollout": "2"}


def test_a_403_of_a_fresh_copy_is_a_real_refusal(kube_api, sender):
    kube_api.add_pod(NS, "web")
    kube_api.fail_next("PUT", POD_PATH + "/status", 403, times=None)
    with pytest.raises(MultusError) as caught:
        write(sender, watched(kube_api))
    assert not isinstance(caught.value, TryAgainLater)
    assert "403 Forbidden" in caught.value.msg and "set the network-status of pod default/web" \
        in caught.value.msg
    assert sender.verbs() == [PUT, GET, PUT]


def test_a_copy_that_already_carries_the_annotation_is_confirmed_with_a_get(kube_api, sender):
    kube_api.add_pod(NS, "web", annotations={NETWORK_STATUS_ANNOTATION: STATUS})
    pod = watched(kube_api)
    write(sender, pod)  # the server has it too: nothing is written
    assert sender.verbs() == [GET]
    kube_api.update_pod(NS, "web", annotations={NETWORK_STATUS_ANNOTATION: "[]"})
    sender.calls.clear()
    write(sender, pod)  # the copy says done, the server says otherwise
    assert sender.verbs() == [GET, PUT]
    assert stored_annotation(kube_api) == STATUS


def test_conflicts_are_retried_up_to_the_attempts_then_try_again_later(kube_api, sender):
    kube_api.add_pod(NS, "web")
    kube_api.fail_next("PUT", POD_PATH + "/status", 409, times=None)
    with pytest.raises(TryAgainLater) as caught:
        write(sender, watched(kube_api))
    assert "default/web" in caught.value.msg and kube_api.url in caught.value.msg
    assert sender.verbs() == [PUT] + [GET, PUT] * (status.STATUS_UPDATE_ATTEMPTS - 1)
    assert stored_annotation(kube_api) is None


def test_a_conflict_or_two_then_success(kube_api, sender):
    kube_api.add_pod(NS, "web")
    kube_api.fail_next("PUT", POD_PATH + "/status", 409, times=2)
    write(sender, watched(kube_api))
    assert sender.verbs() == [PUT, GET, PUT, GET, PUT]
    assert stored_annotation(kube_api) == STATUS


def test_a_stopping_daemon_does_not_go_on_retrying_conflicts(kube_api, sender):
    kube_api.add_pod(NS, "web")
    kube_api.fail_next("PUT", POD_PATH + "/status", 409, times=None)
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(TryAgainLater):
        write(sender, watched(kube_api), stopping=stopping)
    assert sender.verbs() == [PUT, GET, PUT]  # the first pause ends the attempts


def test_a_put_applied_whose_answer_was_lost_is_found_written(kube_api, sender):
    kube_api.add_pod(NS, "web")
    kube_api.fail_next("PUT", POD_PATH + "/status", drop="reset", processed=True)
    write(sender, watched(kube_api))
    # the transport sent the PUT again (409: the first was applied); the GET finds it done
    assert sender.verbs() == [PUT, GET]
    assert kube_api.count("PUT", POD_PATH + "/status") == 2
    assert stored_annotation(kube_api) == STATUS


def test_a_pod_deleted_meanwhile_is_skipped_without_an_error(kube_api, sender, caplog):
    kube_api.add_pod(NS, "web")
    pod = watched(kube_api)
    kube_api.delete_pod(NS, "web")
    with caplog.at_level(logging.INFO, logger="multusd.kube.status"):
        write(sender, pod)
    assert sender.verbs() == [PUT]
    assert "pod default/web is gone" in caplog.text


def test_a_pod_deleted_after_a_conflict_is_skipped_too(kube_api, sender):
    kube_api.add_pod(NS, "web")
    pod = watched(kube_api)
    kube_api.update_pod(NS, "web", phase="Running")
    kube_api.fail_next("GET", POD_PATH, 404)
    write(sender, pod)  # PUT 409, GET 404: nothing to write, nothing raised
    assert sender.verbs() == [PUT, GET]
    assert stored_annotation(kube_api) is None


def test_a_replaced_pod_is_pod_not_found_and_never_written(kube_api, sender):
    kube_api.add_pod(NS, "sts-0", uid="uid-1")
    pod = watched(kube_api, "sts-0")
    kube_api.delete_pod(NS, "sts-0")
    kube_api.add_pod(NS, "sts-0", uid="uid-2")
    with pytest.raises(PodNotFound) as caught:
        write(sender, pod)
    assert "'uid-1'" in caught.value.msg and "'uid-2'" in caught.value.msg
    assert [m for m, _ in sender.verbs()] == ["PUT", "GET"]  # 409 (other UID), then no PUT
    assert stored_annotation(kube_api, "sts-0") is None


def test_a_static_pod_and_a_view_without_uid_skip_the_uid_check(kube_api, sender):
    kube_api.add_pod(NS, "etcd", uid="mirror-uid", static=True)
    runtime_view = Pod(namespace=NS, name="etcd", uid="runtime-uid", annotations={},
                       is_static=True, resource_version="")  # no copy: a GET first
    write(sender, runtime_view)
    assert [m for m, _ in sender.verbs()] == ["GET", "PUT"]
    assert stored_annotation(kube_api, "etcd") == STATUS
    kube_api.add_pod(NS, "plain")
    no_uid = Pod(namespace=NS, name="plain", uid="", annotations={}, is_static=False,
                 resource_version="")
    write(sender, no_uid)
    assert stored_annotation(kube_api, "plain") == STATUS


def test_an_unreachable_server_is_try_again_later(kube_api, sender):
    kube_api.add_pod(NS, "web")
    pod = watched(kube_api)
    kube_api.stop()
    with pytest.raises(TryAgainLater) as caught:
        write(sender, pod, deadline=time.monotonic() + 0.5)
    assert "unreachable" in caught.value.msg


def test_a_server_error_is_try_again_later(kube_api, sender):
    kube_api.add_pod(NS, "web")
    kube_api.fail_next("PUT", POD_PATH + "/status", 500, times=None)
    with pytest.raises(TryAgainLater) as caught:
        write(sender, watched(kube_api), deadline=time.monotonic() + 0.6)
    assert "answered 500" in caught.value.msg


# ---- events ---------------------------------------------------------------------------------

@pytest.fixture
def events(sender):
    made: List[status.EventSender] = []

    def make(node: str = "node-a", stopping: Optional[threading.Event] = None
             ) -> status.EventSender:
        made.append(status.EventSender(sender, sender.config, node,
                                       stopping or threading.Event()))
        return made[-1]

    yield make
    for one in made:
        one.stop(5.0)


def event_messages(api: FakeKubeAPI) -> List[str]:
    return [event["message"] for event in api.events]


def test_an_event_is_created_as_client_gos_recorder_names_it(kube_api, events):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    sender = events("node-7")
    sender.emit(pod, "Normal", "AddedInterface", "Add eth1 [10.1.1.5/24] from default/net1")
    wait_for(lambda: kube_api.events, what="the event")
    event = kube_api.events[0]
    name, _, stamp = event["metadata"]["name"].rpartition(".")
    assert name == "web" and int(stamp, 16) > 0
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": NS,
                                       "name": "web", "uid": pod.uid,
                                       "resourceVersion": pod.resource_version}
    assert (event["type"], event["reason"]) == ("Normal", "AddedInterface")
    assert event["source"] == {"component": "multus", "host": "node-7"}
    assert (event["reportingComponent"], event["reportingInstance"]) == ("multus", "node-7")
    assert event["count"] == 1 and event["firstTimestamp"] == event["lastTimestamp"]


def test_a_long_message_is_cut_to_what_the_api_server_accepts(kube_api, events):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    events().emit(pod, "Warning", "Long", "x" * 5000)
    wait_for(lambda: kube_api.events, what="the event")
    assert event_messages(kube_api) == ["x" * status.EVENT_MESSAGE_LIMIT]


def test_an_unknown_event_type_is_dropped_here(kube_api, events, caplog):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    sender = events()
    with caplog.at_level(logging.WARNING, logger="multusd.kube.status"):
        sender.emit(pod, "Bogus", "X", "dropped")
        sender.emit(pod, "Warning", "Y", "sent")
        wait_for(lambda: kube_api.events, what="the event")
    sender.stop(5.0)  # what was queued has gone out
    assert event_messages(kube_api) == ["sent"]
    assert "type 'Bogus' is not one of" in caplog.text


def test_events_past_the_bound_are_dropped_and_the_rest_go_out_in_order(kube_api, configs,
                                                                        caplog):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    patient = Sender(configs(kube_api), timeout=120.0)  # the held POST must not time out
    sender = status.EventSender(patient, patient.config, "node-a", threading.Event())
    kube_api.blackhole()
    try:
        sender.emit(pod, "Normal", "Held", "held by the silent server")
        wait_for(lambda: kube_api.count("POST", EVENTS_PATH) == 1, what="the first POST")
        with caplog.at_level(logging.WARNING, logger="multusd.kube.status"):
            for n in range(status.EVENT_QUEUE_SIZE + 3):  # the first POST waits: these queue
                sender.emit(pod, "Normal", "Queued", str(n))
        assert caplog.text.count(f"{status.EVENT_QUEUE_SIZE} events are already waiting") == 3
    finally:
        kube_api.blackhole(False)
    wait_for(lambda: kube_api.events, what="the held event")
    sender.stop(60.0)
    assert event_messages(kube_api) == ["held by the silent server"] + \
        [str(n) for n in range(status.EVENT_QUEUE_SIZE)]


def test_a_refused_event_is_logged_and_the_sender_goes_on(kube_api, events, caplog):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    kube_api.fail_next("POST", EVENTS_PATH, 403)
    kube_api.fail_next("POST", EVENTS_PATH, 500)
    sender = events()
    with caplog.at_level(logging.WARNING, logger="multusd.kube.status"):
        for reason in ("Forbidden", "Failed", "Sent"):
            sender.emit(pod, "Normal", reason, reason.lower())
        sender.stop(10.0)
    assert event_messages(kube_api) == ["sent"]
    assert "cannot record event 'Forbidden'" in caplog.text and "403 Forbidden" in caplog.text
    assert "cannot record event 'Failed'" in caplog.text
    assert kube_api.count("POST", EVENTS_PATH) == 3  # a POST's 500 is not sent again


def test_an_event_post_the_server_cannot_have_processed_is_sent_again(kube_api, events):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    kube_api.fail_next("POST", EVENTS_PATH, 429, retry_after=0)
    sender = events()
    sender.emit(pod, "Normal", "Retried", "after 429")
    sender.stop(10.0)
    assert event_messages(kube_api) == ["after 429"]
    assert kube_api.count("POST", EVENTS_PATH) == 2


def event_threads() -> set:
    return {t for t in threading.enumerate() if t.name == "multusd-k8s-events" and t.is_alive()}


def test_emit_never_raises_and_a_stopping_sender_starts_no_thread(kube_api, events, caplog):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    stopping = threading.Event()
    stopping.set()
    before = event_threads()
    sender = events(stopping=stopping)
    with caplog.at_level(logging.WARNING, logger="multusd.kube.status"):
        sender.emit(pod, "Normal", "Late", "after stop")
        sender.emit(pod, "Normal", "Broken", None)  # type: ignore[arg-type]
    assert "event 'Broken' for pod default/web dropped" in caplog.text
    assert event_threads() == before
    sender.stop(1.0)  # no thread: returns at once
    assert kube_api.count("POST", EVENTS_PATH) == 0


def test_stop_lets_queued_events_out_then_ends_the_thread(kube_api, events):
    pod = pod_from_object(kube_api.add_pod(NS, "web"))
    before = event_threads()
    sender = events()
    for n in range(5):
        sender.emit(pod, "Normal", "Queued", str(n))
    started = event_threads() - before
    assert len(started) == 1
    sender.stop(10.0)
    assert not started.pop().is_alive()
    assert event_messages(kube_api) == [str(n) for n in range(5)]
