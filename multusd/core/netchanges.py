"""What a running pod's network-selection annotation asks to change in its sandbox (pure logic).

``enableDynamicNetworks``: the desired state is the pod's ``k8s.v1.cni.cncf.io/networks``
selections, the current state what the sandbox's records hold (its scratch cache: the
attachments multusd made, not what another component put in the pod, nor the network-status
annotation, which anyone can write). :func:`plan` compares them as upstream's
multus-dynamic-networks-controller does, by namespace/name/interface, with these rules of ours:

* only attachments the annotation named are ever removed (what the sandbox's records say named
  each: :attr:`~multusd.core.delegate.Delegate.named_by`), and those multusd added while the
  pod ran: never the cluster network (the first), a ``defaultNetworks`` entry, the
  ``auxiliaryCNIChainName`` chain or a ``delegates`` entry. Records that do not say (an
  earlier multusd's, upstream's) count every NetworkAttachmentDefinition's attachment (named
  ``<namespace>/<name>``) but the ``protected`` ones (``defaultNetworks`` as configured now);
* a new selection the sandbox's ADD would refuse (``refuse``: namespace isolation) is refused
  with the ADD's message;
* a selection without an ``interface`` keeps the attachment of its network that the sandbox's
  ADD named (``net<N>``): upstream's controller would remove that one and fail to add it
  again. A new one is refused: for a running pod multusd adds an interface only under the name
  the selection gives;
* a new selection whose interface name is another attachment's, or asked twice, is refused;
* what changes in a kept selection besides its network and interface (ips, mac, cni-args) does
  nothing: the attachment stays as it was made (upstream's controller does the same);
* an ADD of a running pod that did not finish (:data:`~multusd.core.hotplugrecord.ADDING`
  without a result cache: a restart, a rollback that failed) is undone and the selection
  added anew; one that finished (result cached) counts as added.

Removals come first in :class:`Plan`, so that an interface name can move to another network.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from multusd.core.delegate import BY_NETWORKS_ANNOTATION, Delegate
from multusd.core.hotplugrecord import ADDING, HotplugMark
from multusd.core.selection import NetworkSelection
from multusd.store.valueclass import Record


class Recorded(Record):
    """One attachment of the sandbox as its records hold it."""

    delegate: Delegate
    mark: Optional[HotplugMark] = None  # added while the pod ran
    cached: bool = True  # libcni's result cache holds its result (its ADD finished)

    @property
    def key(self) -> Tuple[str, str]:
        return self.delegate.name, self.delegate.ifname


class Refusal(Record):
    """A selection that is not applied, and why (the pod's Warning event says it)."""

    selection: NetworkSelection
    why: str


class Plan(Record):
    """What to do to a sandbox, in this order: undo, remove, add; ``finished`` to mark added."""

    undo: Tuple[Recorded, ...] = ()       # unfinished hot-plug ADDs: DEL, records dropped
    finished: Tuple[Recorded, ...] = ()   # hot-plug ADDs that finished before a restart
    remove: Tuple[Recorded, ...] = ()     # in reverse order of the records
    add: Tuple[NetworkSelection, ...] = ()
    refused: Tuple[Refusal, ...] = ()

    @property
    def changes(self) -> bool:
        """Whether anything in the pod or its records changes."""
        return bool(self.undo or self.finished or self.remove or self.add)


def selection_name(selection: NetworkSelection) -> str:
    """The network's name as records and network-status have it: ``<namespace>/<name>``."""
    return f"{selection.namespace}/{selection.name}"


def plan(selections: Sequence[NetworkSelection], recorded: Sequence[Recorded], *,
         protected: Iterable[str] = (),
         refuse: Callable[[NetworkSelection], str] = lambda selection: "") -> Plan:
    """The changes that make the sandbox's records match ``selections``.

    :param recorded: the sandbox's attachments, in the scratch cache's order (the first is
        the cluster network).
    :param protected: for attachments whose records do not say what named them: network
        names a selection never removes (the ``defaultNetworks`` entries).
    :param refuse: why the sandbox's ADD would refuse a selection ("" when it would not).
    """
    keep_out = set(protected)
    undo = [r for r in recorded if r.mark is not None and r.mark.state == ADDING and not r.cached]
    finished = [r for r in recorded if r.mark is not None and r.mark.state == ADDING and r.cached]
    present = [r for r in recorded if not any(r is u for u in undo)]
    managed = [r for r in present[1:] if _removable(r, keep_out)]
    matched: Set[int] = set()
    wanted: List[NetworkSelection] = []
    refused: List[Refusal] = []
    named = [s for s in selections if s.interface]
    for selection in named:
        hit = _find(managed, matched, lambda r: r.key == (selection_name(selection),
                                                        selection.interface))
        if hit is None:
            wanted.append(selection)
    for selection in (s for s in selections if not s.interface):
        # the attachment the sandbox's ADD named for a selection without an interface
        hit = _find(managed, matched, lambda r: r.delegate.name == selection_name(selection)
                    and r.mark is None)
        if hit is None:
            refused.append(Refusal(selection=selection, why=(
                f"network {selection_name(selection)} names no interface: multusd adds an "
                "interface to a running pod only under the name its network selection gives; "
                "add \"interface\": \"<name>\" to the element (or the @<name> suffix)")))
    remove = [r for index, r in enumerate(managed) if index not in matched]
    taken = _owners(r for r in present if not any(r is g for g in remove))
    add: List[NetworkSelection] = []
    for selection in wanted:
        why = refuse(selection)
        if why:
            refused.append(Refusal(selection=selection, why=why))
            continue
        owner = taken.get(selection.interface)
        if owner is not None:
            refused.append(Refusal(selection=selection, why=(
                f"interface {selection.interface} of network {selection_name(selection)} is "
                f"already {owner}; choose another interface name")))
            continue
        taken[selection.interface] = f"asked for network {selection_name(selection)}"
        add.append(selection)
    return Plan(undo=tuple(undo), finished=tuple(finished), remove=tuple(reversed(remove)),
                add=tuple(add), refused=tuple(refused))


def _removable(recorded: Recorded, protected: Set[str]) -> bool:
    """The annotation named it (or multusd added it while the pod ran); in records that do not
    say, a NAD's attachment (named ``<namespace>/<name>``) that is no protected network."""
    if recorded.mark is not None:
        return True
    if recorded.delegate.named_by:
        return recorded.delegate.named_by == BY_NETWORKS_ANNOTATION
    return "/" in recorded.delegate.name and recorded.delegate.name not in protected


def _find(candidates: Sequence[Recorded], matched: Set[int], test) -> Optional[Recorded]:
    for index, candidate in enumerate(candidates):
        if index not in matched and test(candidate):
            matched.add(index)
            return candidate
    return None


def _owners(recorded: Iterable[Recorded]) -> Dict[str, str]:
    """Interface name -> what holds it, for the attachments that stay."""
    return {r.delegate.ifname: f"the pod's attachment to network {r.delegate.name}"
            for r in recorded}
