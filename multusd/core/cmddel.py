"""DEL of a pod sandbox, and ``multusd gc --forget``: every delegate it recorded, released.

The rules it keeps (architecture.md, invariants 4 and 10):

* DEL is idempotent and best-effort complete: gone pod, NAD, netns or cache do not stop it;
  a missing or corrupt scratch cache falls back to libcni's result cache; a failed delegate
  does not stop the others (dependents are released before what they depend on);
* a CNI_NETNS that is there but is no namespace (a FIFO, a file, a hung mount) is dropped:
  the delegates run without one rather than each waiting out the deadline;
* the sandbox's records stay until every delegate's DEL succeeded (upstream's
  ``retryDeleteOnError``, always); a delegate's DEL error is returned, so that the runtime
  retries instead of leaking, for the sandbox's ``deleteRetryWindow``
  (:mod:`multusd.core.unreleased`); after it, DEL answers success so that the pod can
  terminate, and the sandbox's records stay, marked unreleased, until the daemon's own
  retries (or ``multusd gc``) release it; a DEL that succeeds drops the mark;
* a retry runs the DEL of the delegates still held only: the mark records which were
  released (the scratch cache keeps upstream's format, every delegate in it);
* records that cannot be removed once everything is released (a read-only disk) are
  reported as a failure is, so that the drain finishes and they are dropped later.

It is judged by the configuration the sandbox was attached under, where the sandbox records
it (:mod:`multusd.core.sandboxconfig`: the directories, the auxiliary chain), else by the
request's; no settings are needed: a DEL must work whatever else the config gets wrong.
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

from multusd import store
from multusd.cni import resultcache
from multusd.cni.conflist import Engine
from multusd.cni.invoke import missing_plugin
from multusd.core import delmarks, sandboxconfig, scratch, unreleased
from multusd.core.delegate import Delegate
from multusd.core.request import CmdArgs, pod_prefix
from multusd.core.runner import DelegateRunner, Failures, as_cni_error
from multusd.errors import MultusError, UnknownContainer
from multusd.node.netns import check_namespace
from multusd.store.valueclass import Record, replace


def cmd_del(req: CmdArgs, deadline: float, log: Any, *, engine: Engine, kube: Any,
            parallel_delegates: bool = False, window: float, spare: str = "",
            notices: Optional[sandboxconfig.Notices] = None,
            other_dirs: Callable[[], Sequence[str]] = tuple) -> None:
    """DEL of the sandbox ``req`` names, judged by the configuration it was attached under
    (:func:`~multusd.core.sandboxconfig.sandbox_request`).

    :param window: the daemon's ``deleteRetryWindow``.
    :param spare: the marks' directory for when ``<cniDir>`` cannot take one
        (:func:`~multusd.core.delmarks.spare_marks_dir`).
    :param notices: what was said of sandboxes already; ``other_dirs``: every ``cniDir`` the
        node names, where the records are looked for when they are not in the request's.
    :raises MultusError: a delegate's DEL failed, while the sandbox's window lasts.
    """
    if not req.container_id:
        log.warning("DEL without CNI_CONTAINERID: nothing can be found to delete")
        return
    req = sandboxconfig.sandbox_request(req, log, notices=notices, other_dirs=other_dirs)
    cni_dir = req.effective.cni_dir
    earlier = delmarks.read(cni_dir, req.container_id, spare=spare)
    done = release(req, deadline, log, engine=engine, parallel_delegates=parallel_delegates,
                   skip=earlier.released if earlier is not None else ())
    if done.failures:
        # kept until every delegate's DEL succeeds (upstream's retryDeleteOnError, always);
        # the error reaches the runtime for the sandbox's window, then DEL answers success
        found = [delmarks.Failure(network=delegate.name, ifname=delegate.ifname,
                                  error=as_cni_error(exc, log).msg)
                 for delegate, exc in done.failures]
        unreleased.report(cni_dir, done.req, found, f"{pod_prefix(req)}: DEL failed for "
                          f"{len(found)} network(s), the runtime will retry: "
                          + " / ".join(f"{f.network} ({f.ifname}): {f.error}" for f in found)
                          + missing_plugin_hint(req, done.failures),
                          window=window, kube=kube, log=log, released=done.released,
                          spare=spare)
        return
    try:
        store.remove(done.scratch_path)
    except MultusError as exc:  # everything is released; only the record is left
        unreleased.report(cni_dir, done.req, (), f"{pod_prefix(req)}: DEL released every "
                          f"network, but its records cannot be removed: {exc.msg}",
                          window=window, kube=kube, log=log, released=done.released,
                          spare=spare)
        return
    if delmarks.clear(cni_dir, req.container_id, spare=spare):
        log.info("DEL: the sandbox's earlier DEL failures are over")
    log.info("DEL: %d network(s) released", len(done.delegates) - len(done.skipped))


def forget(req: CmdArgs, deadline: float, log: Any, *, engine: Engine,
           parallel_delegates: bool = False, spare: str = "",
           other_dirs: Callable[[], Sequence[str]] = tuple) -> List[Tuple[Delegate, str]]:
    """DEL every delegate of the sandbox, then drop its records and its mark whatever failed.

    For ``multusd gc --forget``: the operator's knowing decision for a sandbox whose DEL
    cannot succeed (a plugin binary that is gone for good). Returns ``(delegate, "")``
    for each delegate released and ``(delegate, why not)`` for each that was not.
    ``spare`` and ``other_dirs`` as for :func:`cmd_del`.
    """
    req = sandboxconfig.sandbox_request(req, log, other_dirs=other_dirs)
    done = release(req, deadline, log, engine=engine, parallel_delegates=parallel_delegates)
    cni_dir = req.effective.cni_dir
    failed = {id(d): as_cni_error(exc, log).msg for d, exc in done.failures}
    for entry in resultcache.list_entries(cni_dir):
        if entry.get("containerId") == req.container_id:
            resultcache.delete(cni_dir, str(entry["networkName"]), req.container_id,
                               str(entry["ifName"]))
    store.remove(done.scratch_path)
    delmarks.clear(cni_dir, req.container_id, spare=spare)
    outcome = [(d, failed.get(id(d), "")) for d in done.delegates]
    for delegate, why in outcome:
        if why:
            log.warning("gc --forget %s: %s (%s) NOT released, its records dropped: %s",
                        req.container_id, delegate.name, delegate.ifname, why)
    log.info("gc --forget %s: %d of %d network(s) released, every record dropped",
             req.container_id, sum(1 for _, why in outcome if not why), len(outcome))
    return outcome


class Release(Record):
    """What :func:`release` did: the request as run (CNI_NETNS dropped when it was no
    namespace), the sandbox's scratch cache, its delegates, those skipped (released by an
    earlier DEL) and those whose DEL failed."""

    req: CmdArgs
    scratch_path: str
    delegates: Tuple[Delegate, ...]
    failures: Failures
    skipped: Tuple[Delegate, ...] = ()

    @property
    def released(self) -> Tuple[delmarks.Released, ...]:
        """Every delegate released by now: skipped, or whose DEL succeeded."""
        failed = {id(delegate) for delegate, _ in self.failures}
        return tuple(delmarks.Released(network=d.name, ifname=d.ifname)
                     for d in self.delegates if id(d) not in failed)


def release(req: CmdArgs, deadline: float, log: Any, *, engine: Engine,
            parallel_delegates: bool = False,
            skip: Sequence[delmarks.Released] = ()) -> Release:
    """DEL of every delegate the sandbox recorded, best-effort complete: a failed delegate
    does not stop the others; those in ``skip`` (released by an earlier DEL of the sandbox)
    are not run again. The records are the caller's to keep or drop."""
    req = netns_for_del(req, log)
    path = scratch.cache_path(req.effective.cni_dir, req.container_id)
    delegates = delegates_for_del(req, path, log)
    done = {(r.network, r.ifname) for r in skip}
    held = [i for i, d in enumerate(delegates)
            if (d.name, d.ifname) not in done or _has_result(req, d)]
    skipped = tuple(d for i, d in enumerate(delegates) if i not in held)
    if skipped:
        log.info("DEL: %s released by an earlier DEL; running the DEL of %d network(s) still "
                 "held", ", ".join(f"{d.ifname} ({d.name})" for d in skipped), len(held))
    runner = DelegateRunner(engine, req, deadline, log, parallel_delegates=parallel_delegates,
                            auxiliary_chain=req.effective.auxiliary_chain)
    return Release(req=req, scratch_path=path, delegates=tuple(delegates),
                   failures=runner.delete_all(delegates, only=held), skipped=skipped)


def _has_result(req: CmdArgs, delegate: Delegate) -> bool:
    """libcni's result cache still holds ``delegate``'s attachment: it is not released,
    whatever a mark says (libcni drops the entry when its DEL succeeds; a mark left from
    before a new ADD of the container ID must not skip anything)."""
    try:
        return os.path.exists(resultcache.result_path(
            req.effective.cni_dir, delegate.conf_name, req.container_id, delegate.ifname))
    except MultusError:
        return False  # a name that cannot be cached has no entry


def netns_for_del(req: CmdArgs, log: Any) -> CmdArgs:
    """The request, with CNI_NETNS dropped when it is there but is not a namespace.

    A FIFO, a plain file or a hung mount would hold every delegate's DEL until the deadline;
    the spec allows DEL without a netns, so IPAM and host-side state are still released. A
    netns that is gone is passed on: plugins handle that themselves.
    """
    if not req.netns:
        return req
    try:
        check_namespace(req.netns)
    except UnknownContainer:
        return req
    except MultusError as exc:
        log.warning("DEL: %s; running the delegates without a network namespace", exc.msg)
        return replace(req, netns="")
    return req


def delegates_for_del(req: CmdArgs, path: str, log: Any) -> List[Delegate]:
    """The delegates the scratch cache at ``path`` records; libcni's result cache's when it
    is missing or unreadable."""
    try:
        data = scratch.read_cache(path)
        if data is not None:
            return scratch.delegates_from_cache(data, top_cni_version=req.cni_version,
                                                cni_ifname=req.ifname)
    except MultusError as exc:
        log.error("scratch cache %s is unreadable (%s): deleting what libcni's result "
                  "cache still knows about", path, exc.msg)
    return delegates_from_result_cache(req, log)


def delegates_from_result_cache(req: CmdArgs, log: Any) -> List[Delegate]:
    """Rebuild the delegates from ``<cniDir>/results/*-<containerID>-*`` (no scratch cache)."""
    found = []
    for entry in resultcache.list_entries(req.effective.cni_dir):
        if entry.get("containerId") != req.container_id:
            continue
        config = resultcache.decode_config(entry)
        found.append(Delegate(
            name=str(entry.get("networkName", "")), conf=config,
            ifname=str(entry.get("ifName", "")), master=entry.get("ifName") == req.ifname))
    found.sort(key=lambda d: (not d.master, d.ifname))
    if found:
        log.warning("no scratch cache for %s: deleting %d attachment(s) found in the "
                    "result cache", req.container_id, len(found))
    return found


def missing_plugin_hint(req: CmdArgs, failures: Failures) -> str:
    """The two ways out when a DEL failed because a plugin binary is gone; "" otherwise."""
    missing = [found for found in (missing_plugin(exc) for _, exc in failures) if found]
    if not missing:
        return ""
    names = ", ".join(sorted({name for name, _ in missing}))
    dirs = ", ".join(dict.fromkeys(d for _, searched in missing for d in searched))
    return (f". Plugin {names} is not installed (searched {dirs}), so this sandbox cannot be "
            f"released and its records stay: install {names} again, or drop the records "
            f"knowingly with `multusd gc --forget {req.container_id}` (it releases what the "
            f"other plugins can; what {names} set up stays as it is)")
