"""A sandbox's dynamic attachments as its scratch cache records them, in keys upstream skips.

``enableDynamicNetworks`` (:mod:`multusd.core.reconcile`) adds and removes attachments of a
running pod; what it did is kept in the sandbox's own scratch cache ``<cniDir>/<containerID>``,
so that it goes with the sandbox (the runtime's DEL removes the file) and survives a restart.
Two keys of ours, which upstream's ``DelegateNetConf`` has no field for (Go's decoder skips
them, as it skips ``draDevice``):

* ``multusdHotplug`` on the entry of a delegate added while the pod ran:
  ``{"state": "adding"|"added", "since": <seconds since the epoch>}``. ``adding`` is written
  before its plugins run: an entry still ``adding`` later is an ADD that a restart (or a
  rollback that failed) interrupted; its libcni result cache says whether the ADD finished;
* ``multusdRemoved`` on the first entry (the cluster network's, never removed): the
  attachments removed while the pod ran, ``[{"name", "interface", "at"}]``, oldest first, at
  most :data:`MAX_REMOVED` (``multusd show`` lists them).

Entries are edited as the file holds them (:class:`ScratchEntries`), never rebuilt from
delegates: an entry another daemon wrote (upstream's, with its ``CNINetworkConfigList``) stays
byte for byte, so that the runtime's DEL releases exactly what its ADD made. Removing an entry
pins the interface name of every later one that has none requested (``ifnameRequest``): DEL
names an unnamed secondary ``net<position>``, and its position changes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd.core import scratch
from multusd.core.delegate import Delegate
from multusd.errors import DecodeFailure
from multusd.store.valueclass import Record

ADDING, ADDED = "adding", "added"
HOTPLUG_KEY = "multusdHotplug"
REMOVED_KEY = "multusdRemoved"
MAX_REMOVED = 16  # removals kept for `multusd show`: a pod that flaps does not grow its file


class HotplugMark(Record):
    """A delegate added while the pod ran: ``adding`` until its ADD finished, then ``added``."""

    state: str
    since: float  # when it was added (seconds since the epoch)

    def to_json(self) -> Dict[str, Any]:
        return {"state": self.state, "since": round(self.since, 3)}


class Removal(Record):
    """An attachment removed while the pod ran: its network, interface and when."""

    network: str
    ifname: str
    at: float

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.network, "interface": self.ifname, "at": round(self.at, 3)}


def mark_of(entry: Mapping[str, Any]) -> Optional[HotplugMark]:
    """The hot-plug mark of one scratch-cache entry; None for one the sandbox's ADD made (or
    a mark that does not parse: the entry is then treated as the ADD's, never removed for it)."""
    raw = entry.get(HOTPLUG_KEY)
    if not isinstance(raw, dict) or raw.get("state") not in (ADDING, ADDED):
        return None
    since = raw.get("since")
    return HotplugMark(state=raw["state"],
                       since=float(since) if isinstance(since, (int, float)) else 0.0)


def removals_of(entry: Mapping[str, Any]) -> Tuple[Removal, ...]:
    """The removals the first entry of a scratch cache records (malformed items skipped)."""
    raw = entry.get(REMOVED_KEY)
    found = []
    for item in raw if isinstance(raw, list) else ():
        if isinstance(item, dict) and isinstance(item.get("name"), str) and \
                isinstance(item.get("interface"), str):
            at = item.get("at")
            found.append(Removal(network=item["name"], ifname=item["interface"],
                                 at=float(at) if isinstance(at, (int, float)) else 0.0))
    return tuple(found)


def read_marks(data: Optional[bytes]) -> Tuple[List[Optional[HotplugMark]], Tuple[Removal, ...]]:
    """(the mark of each entry, the removals) of a scratch cache's bytes; nothing for bytes
    that are not a scratch cache (its reader reports that)."""
    try:
        entries = ScratchEntries.parse(data or b"")
    except DecodeFailure:
        return [], ()
    return entries.marks(), entries.removals()


class ScratchEntries:
    """The entries of one scratch cache, edited in place (see the module docstring)."""

    def __init__(self, entries: List[Dict[str, Any]]) -> None:
        self.entries = entries

    @classmethod
    def parse(cls, data: bytes) -> "ScratchEntries":
        """:raises DecodeFailure: ``data`` is not a JSON list of objects."""
        return cls(scratch.cache_entries(data))

    def marks(self) -> List[Optional[HotplugMark]]:
        return [mark_of(entry) for entry in self.entries]

    def removals(self) -> Tuple[Removal, ...]:
        return removals_of(self.entries[0]) if self.entries else ()

    def append(self, delegate: Delegate, mark: HotplugMark) -> int:
        """Record ``delegate`` last, with ``mark``; its index."""
        entry = scratch.cache_entry(delegate)
        entry[HOTPLUG_KEY] = mark.to_json()
        self.entries.append(entry)
        return len(self.entries) - 1

    def set_mark(self, index: int, mark: HotplugMark) -> None:
        self.entries[index][HOTPLUG_KEY] = mark.to_json()

    def drop(self, index: int, ifnames: Sequence[str],
             removal: Optional[Removal] = None) -> None:
        """Remove entry ``index`` (never the first); ``ifnames``: every entry's interface
        name before the removal, in order, to pin the later ones'. ``removal`` is recorded
        (an ADD rolled back records none: nothing the user saw went away)."""
        if index <= 0:
            raise ValueError("the first scratch-cache entry (the cluster network) is never removed")
        for later in range(index + 1, len(self.entries)):
            entry = self.entries[later]
            if not entry.get("ifnameRequest") and later < len(ifnames):
                self.entries[later] = _with_ifname_request(entry, ifnames[later])
        del self.entries[index]
        if removal is not None:
            first = self.entries[0]
            kept = [r.to_json() for r in removals_of(first)] + [removal.to_json()]
            first[REMOVED_KEY] = kept[-MAX_REMOVED:]

    def to_bytes(self) -> bytes:
        return scratch.encode_entries(self.entries)


def _with_ifname_request(entry: Mapping[str, Any], ifname: str) -> Dict[str, Any]:
    """``entry`` with ``ifnameRequest``, where upstream's field order puts it (after Name)."""
    out: Dict[str, Any] = {}
    for key, value in entry.items():
        out[key] = value
        if key == "Name":
            out["ifnameRequest"] = ifname
    out.setdefault("ifnameRequest", ifname)
    return out
