"""Saying that a sandbox is unreleased: one journal warning, and a Warning Event on its pod.

Once a sandbox's DEL window is over (:mod:`multusd.core.unreleased`), the runtime is answered
success and nobody is told any more by a failing DEL: the daemon says it once instead, in the
journal (what failed, since when, what multusd does about it, what the operator can do) and
as an Event ``NetworkNotReleased`` on the pod while it still exists. The Event is judged from
the pod watch cache only (never a wait on the API server): while the cache has never listed,
nothing is said and the caller tries again later. The caller records that it was said
(:func:`multusd.core.delmarks.set_announced`), so that it is said once.
"""

from __future__ import annotations

import time
from typing import Any, Tuple

from multusd.core.delmarks import FailedDelete, stamp
from multusd.errors import MultusError

EVENT_REASON = "NetworkNotReleased"


def announce(kube: Any, mark: FailedDelete, log: Any, *, without_cache: bool = False) -> bool:
    """Say that ``mark``'s sandbox is unreleased: a journal warning, and a Warning Event on
    the pod while it still exists (sent in the background, never fails). False, and nothing
    said, while the pod cache has never listed (unless ``without_cache``): the Event needs it,
    and the caller tries again later (the daemon's retrier, which gives up waiting after a
    while). The caller records the announcement
    (:func:`~multusd.core.delmarks.set_announced`)."""
    if kube is not None and not without_cache and not _listed(kube):
        return False
    now = time.time()
    pod = mark.pod or "no pod"
    log.warning("DEL of sandbox %s (%s) has failed since %s (%d attempt(s)): %s. The "
                "runtime now gets success so that the pod can terminate; the sandbox stays "
                "recorded as unreleased (`multusd status`), and multusd retries its DEL "
                "until it is released (`multusd gc` at once, once the cause is fixed)",
                mark.container_id, pod, stamp(mark.first_failure), mark.attempts,
                mark.what_failed(),
                extra={"CNI_CONTAINERID": mark.container_id, "UNRELEASED_SINCE":
                       stamp(min(mark.until, now))})
    args = dict(mark.cni_args)
    known, live = _cached_pod(kube, args.get("K8S_POD_NAMESPACE", ""),
                              args.get("K8S_POD_NAME", ""), args.get("K8S_POD_UID", ""))
    if known and live is not None:
        kube.emit_event(live, "Warning", EVENT_REASON, _clip(
            f"the networks of sandbox {mark.container_id[:12]} could not be released: "
            f"{mark.what_failed()}; the pod may terminate, and what they hold stays recorded "
            "until multusd releases it (it retries; `multusd gc` at once)"))
    return True


def _listed(kube: Any) -> bool:
    try:
        return bool(kube.ready())
    except MultusError:
        return False


def _cached_pod(kube: Any, namespace: str, name: str, uid: str) -> Tuple[bool, Any]:
    """(whether the API's view is known, the pod or None) from the watch cache only."""
    if kube is None or not namespace or not name:
        return False, None
    try:
        if not kube.synced() or kube.node_mismatch is not None:
            return False, None
        pod = kube.cached_pod(namespace, name)
    except MultusError:
        return False, None
    if pod is not None and uid and pod.uid != uid and not pod.is_static:
        return True, None  # deleted, and another pod of that name made since
    return True, pod


def _clip(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
