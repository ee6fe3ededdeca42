"""Which of a pod's delegates may run at the same time, and running each group concurrently.

Only with ``"parallelDelegates": true`` (an opt-in; by default every delegate runs in order,
as libcni and upstream Multus run one container's networks). The delegates of one request
are then split into *waves* (:func:`plan`): the master (the first delegate, ``eth0``) alone,
then every secondary whose config does not depend on another attachment, then the dependent
ones, each in a later wave than what it depends on. A delegate depends on

* the master, on ADD (upstream runs the cluster network first; on DEL the master is
  released together with the secondaries that do not name its interface);
* every earlier delegate, when its config (or one plugin of its conflist) says
  ``"linkInContainer": true`` (vlan, macvlan, ipvlan: the master link is one of the pod's
  interfaces) or ``"linksInContainer": true`` (bond-cni: its ``links`` are pod interfaces),
  or when it is the ``auxiliaryCNIChainName`` chain (it works on what the others made; a
  ``passthru`` head marks it);
* the delegate whose interface name it gives as ``master`` or ``link``, or in ``links``
  (``[{"name": "net1"}, ...]`` or ``["net1", ...]``), in the config or any plugin of it.

A pod that requests a ``default-route`` runs strictly in order: the route fixup after each
delegate changes what the next plugin finds in the namespace.

:func:`run_each` runs one wave: the calling thread takes a share of the work and at most
``limit - 1`` short-lived threads take the rest; it returns once every call has ended (each
is bounded by the request's deadline), so nothing runs on after the request. ADD walks the
waves forward; DEL (and the rollback of a failed ADD) walks the waves of a plan without the
master rule backwards (:func:`reverse_waves`). No netlink here: only delegate plugins run in
these threads (an ADD's default-route fixups run after each wave, on the request's thread).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from multusd import go_field, go_loads

T = TypeVar("T")

DEFAULT_LIMIT = 4
"""Delegates of one request running at once (the request's thread included)."""

_LINK_KEYS = ("master", "link")
"""Keys whose string value names one interface the plugin uses (in the pod or on the host)."""

_IN_CONTAINER_KEYS = ("linkInContainer", "linksInContainer")
"""Keys that, set to true, say the named links are interfaces of the pod."""


def plan(delegates: Sequence[Any], *, parallel: bool = True, auxiliary_chain: str = "",
         master_first: bool = True) -> List[List[int]]:
    """The delegate indices grouped into waves, in execution order (each wave ascending).

    :param delegates: objects with ``conf`` (bytes), ``ifname``, ``name`` and
        ``gateway_request``, the first being the master.
    :param parallel: False gives one delegate per wave: the sequential order (the daemon's
        default, ``parallelDelegates`` unset).
    :param auxiliary_chain: the config's ``auxiliaryCNIChainName`` ("" when unset).
    :param master_first: every secondary waits for the master (ADD). DEL passes False:
        releasing the master does not wait for secondaries that do not name it.
    """
    count = len(delegates)
    if not parallel or count <= 1 or any(
            getattr(d, "gateway_request", None) is not None for d in delegates):
        return [[index] for index in range(count)]
    owner = {d.ifname: index for index, d in enumerate(delegates) if d.ifname}
    level = [0] * count
    for index in range(1, count):
        plugins = _plugins(delegates[index].conf)
        if _after_all(delegates[index], plugins, auxiliary_chain):
            after = range(index)
        else:
            after = [0] if master_first else []
            after += [owner[name] for name in _link_names(plugins)
                      if owner.get(name, index) < index]
        level[index] = 1 + max(level[j] for j in after) if after else 0
    waves: List[List[int]] = [[] for _ in range(max(level) + 1)]
    for index, depth in enumerate(level):
        waves[depth].append(index)
    return waves


def reverse_waves(waves: Sequence[Sequence[int]],
                  only: Optional[Iterable[int]] = None) -> List[List[int]]:
    """The waves for undoing (DEL): last wave first, each wave in descending order.

    :param only: keep just these indices (the delegates an ADD started), dropping empty waves.
    """
    keep = None if only is None else set(only)
    undo = []
    for wave in reversed(waves):
        picked = [i for i in reversed(wave) if keep is None or i in keep]
        if picked:
            undo.append(picked)
    return undo


Outcome = Tuple[Optional[T], Optional[BaseException]]


def run_each(function: Callable[[Any], T], items: Sequence[Any],
             limit: int = DEFAULT_LIMIT) -> List[Outcome]:
    """``function(item)`` for each of ``items``, at most ``limit`` at once; returns
    ``(value, None)`` or ``(None, exc)`` for each, in the order given. Returns only once every
    call has ended; one item runs on the calling thread alone."""
    outcomes: List[Outcome] = [(None, None)] * len(items)
    pending = iter(range(len(items)))
    take = threading.Lock()

    def work() -> None:
        while True:
            with take:
                index = next(pending, None)
            if index is None:
                return
            try:
                outcomes[index] = (function(items[index]), None)
            except BaseException as exc:  # reported to the caller, who decides (no call is
                outcomes[index] = (None, exc)  # ever left looking like a success)

    helpers = [threading.Thread(target=work, name="multusd-delegate", daemon=True)
               for _ in range(min(limit, len(items)) - 1)]
    for thread in helpers:
        thread.start()
    try:
        work()
    finally:
        for thread in helpers:
            thread.join()
    return outcomes


def _plugins(conf: bytes) -> List[Mapping[str, Any]]:
    try:
        data = go_loads(conf)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    plugins = data.get("plugins")
    if isinstance(plugins, list):
        return [p for p in plugins if isinstance(p, dict)]
    return [data]


def _after_all(delegate: Any, plugins: Sequence[Mapping[str, Any]], auxiliary_chain: str) -> bool:
    if auxiliary_chain and delegate.name == auxiliary_chain:
        return True
    if plugins and go_field(plugins[0], "type") == "passthru":
        return True
    return any(go_field(p, key) is True for p in plugins for key in _IN_CONTAINER_KEYS)


def _link_names(plugins: Sequence[Mapping[str, Any]]) -> List[str]:
    """Every interface name the plugins give as ``master``, ``link`` or in ``links``."""
    # The plugins' own structs read these keys: "Master" is a master too.
    names = [go_field(p, key) for p in plugins for key in _LINK_KEYS
             if isinstance(go_field(p, key), str)]
    for plugin in plugins:
        links = go_field(plugin, "links")
        for link in links if isinstance(links, list) else ():
            name = link.get("name") if isinstance(link, dict) else link
            if isinstance(name, str) and name:
                names.append(name)
    return names
