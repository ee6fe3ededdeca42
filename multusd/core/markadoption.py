"""Which marks of failed DELs stand, wherever the node keeps them: each beside its records, released ones dropped.

A request records its sandbox, and the mark of its failed DEL (:mod:`multusd.core.delmarks`),
in its effective ``cniDir``, which is one of those this node's configuration names
(:func:`multusd.core.effective.node_cni_dirs`: daemon-config.json's, the runtime's multus
config's, Multus's default), or beside the socket (the *spare* directory) when that one could
not take the mark. Every reader of marks (the DEL retrier, the unreleased-sandboxes gauge,
``multusd status/show/gc/doctor``) looks in all of them, here, and finds each mark's sandbox
where its records are (:func:`records_dir`): the cniDir the mark names, the one it was found
in, or another the node names.

A mark stands while its sandbox has records (a scratch cache or a result-cache entry) in one
of those places. Two things make one stray:

* a shim that marked in another cniDir than the one its records are in (a shim older than
  issue 37, or whose config named another cniDir than the daemon's): :func:`tidy` moves the
  mark beside its records, so that the DEL's own mark and its window are one;
* the sandbox was released: by the daemon's DEL, which drops its own mark and not a copy
  elsewhere, or by something that drops no marks at all (upstream's daemon, ``gc --forget``
  run outside the daemon): :func:`tidy` drops them, :func:`drop_if_released` one sandbox's
  (the daemon's, once it answered that sandbox's DEL).

The daemon's DEL retrier tidies at each look; ``multusd gc`` before it retries.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from multusd import MARKED_BY_DAEMON, unreleased_marks_dir
from multusd.cni.resultcache import RESULTS_DIR
from multusd.core.delmarks import FailedDelete, clear, read, read_in, read_place, write
from multusd.errors import MultusError
from multusd.store.valueclass import Record, replace


class Tidied(Record):
    """What :func:`tidy` did: marks moved beside their records, marks of released sandboxes
    dropped (container IDs), and why a mark could not be moved (it stays where it is, read
    from there)."""

    moved: Tuple[str, ...] = ()
    dropped: Tuple[str, ...] = ()
    problems: Tuple[str, ...] = ()


def has_records(cni_dir: str, container_id: str) -> bool:
    """The sandbox still has records (a scratch cache or a result-cache entry) in
    ``cni_dir``."""
    return _Records().held(cni_dir, container_id)


def records_dir(mark: FailedDelete, cni_dirs: Sequence[str]) -> str:
    """Where ``mark``'s sandbox has its records: the cniDir the mark names, the one it was
    found in, or another of ``cni_dirs`` (every cniDir the node names); "" when nowhere (it
    is released)."""
    return _Records().home(mark, _distinct(cni_dirs))


def node_marks(cni_dirs: Sequence[str], spare: str = "") -> Dict[str, FailedDelete]:
    """Every mark the node keeps (in each of ``cni_dirs``, and in ``spare``) whose sandbox has
    records, by container ID, each with ``cni_dir`` where those records are. One per sandbox:
    the one beside its records, else the spare one, else the daemon's."""
    dirs = _distinct(cni_dirs)
    index = _Records()
    found: Dict[str, Tuple[Tuple[int, int, float], FailedDelete]] = {}
    for place, mark in _every_mark(dirs, spare):
        home = index.home(mark, dirs)
        if not home:
            continue
        rank = _rank(place, home, spare, mark)
        kept = found.get(mark.container_id)
        if kept is None or rank < kept[0]:
            found[mark.container_id] = (rank, replace(mark, cni_dir=home))
    return {cid: found[cid][1] for cid in sorted(found)}


def mark_of(cni_dirs: Sequence[str], container_id: str, spare: str = ""
            ) -> Optional[FailedDelete]:
    """The mark of ``container_id`` as :func:`node_marks` has it (None: none stands)."""
    dirs = _distinct(cni_dirs)
    index = _Records()
    best: Optional[Tuple[Tuple[int, int, float], FailedDelete]] = None
    for place in _places(dirs, spare):
        mark = read_in(place, container_id)
        home = index.home(mark, dirs) if mark is not None else ""
        if not home:
            continue
        rank = _rank(place, home, spare, mark)
        if best is None or rank < best[0]:
            best = (rank, replace(mark, cni_dir=home))
    return best[1] if best is not None else None


def tidy(cni_dirs: Sequence[str], spare: str = "") -> Tidied:
    """Each mark in ``cni_dirs`` moved beside its sandbox's records when it is elsewhere (a
    mark kept there already stands, the stray copy goes), and every mark of a sandbox with
    no records left dropped (in ``spare`` too). Never raises: a mark that can be written
    neither beside its records nor in ``spare`` stays where it is (``problems`` says why).
    """
    dirs = _distinct(cni_dirs)
    index = _Records()
    moved: List[str] = []
    dropped: List[str] = []
    problems: List[str] = []
    for place, mark in _every_mark(dirs, spare):
        home = index.home(mark, dirs)
        cid = mark.container_id
        if not home:
            if _clear_everywhere(dirs, cid, spare):
                dropped.append(cid)
        elif place != spare and not _beside(place, home):
            try:
                if read(home, cid, spare=spare) is None:
                    write(home, replace(mark, cni_dir=home), spare, mark)
                else:
                    _remove(place, cid)
            except MultusError as exc:
                problems.append(exc.msg)
                continue
            moved.append(cid)
    return Tidied(moved=tuple(moved), dropped=tuple(dropped), problems=tuple(problems))


def drop_if_released(cni_dirs: Sequence[str], container_id: str, spare: str = "") -> bool:
    """Every mark of ``container_id`` dropped when its sandbox has no records left in any of
    ``cni_dirs``; True if one was. Costs an open of a missing file per place when nothing
    is marked (what nearly every DEL finds)."""
    if not any(os.path.exists(os.path.join(place, container_id))
               for place in _places(list(dict.fromkeys(cni_dirs)), spare)):
        return False
    dirs = _distinct(cni_dirs)
    index = _Records()
    if any(index.held(d, container_id) for d in dirs):
        return False
    return _clear_everywhere(dirs, container_id, spare)


# --- internals -----------------------------------------------------------------------------


class _Records:
    """Which sandboxes have records where, each ``results/`` listed once per look."""

    def __init__(self) -> None:
        self._results: Dict[str, Set[str]] = {}

    def held(self, cni_dir: str, container_id: str) -> bool:
        if os.path.exists(os.path.join(cni_dir, container_id)):
            return True
        marker = f"-{container_id}-"
        return any(marker in name for name in self._listing(cni_dir))

    def home(self, mark: FailedDelete, dirs: Sequence[str]) -> str:
        found_in = next((d for d in dirs if unreleased_marks_dir(d) == mark.place), "")
        for directory in _distinct([mark.cni_dir, found_in, *dirs]):
            if self.held(directory, mark.container_id):  # as the node spells it
                real = os.path.realpath(directory)
                return next((d for d in dirs if os.path.realpath(d) == real), directory)
        return ""

    def _listing(self, cni_dir: str) -> Set[str]:
        if cni_dir not in self._results:
            try:
                self._results[cni_dir] = set(os.listdir(os.path.join(cni_dir, RESULTS_DIR)))
            except OSError:
                self._results[cni_dir] = set()
        return self._results[cni_dir]


def _distinct(cni_dirs: Iterable[str]) -> List[str]:
    """``cni_dirs`` in order, each directory once (by its real path), none empty."""
    if isinstance(cni_dirs, str):
        raise TypeError("cni_dirs is a sequence of directories, not one")
    seen: Set[str] = set()
    out = []
    for directory in cni_dirs:
        real = os.path.realpath(directory) if directory else ""
        if real and real not in seen:
            seen.add(real)
            out.append(directory)
    return out


def _rank(place: str, home: str, spare: str, mark: FailedDelete) -> Tuple[int, int, float]:
    """Which of a sandbox's marks stands (the lowest): the one beside its records, else the
    spare one, else another cniDir's; then the daemon's; then the latest failure."""
    return (0 if _beside(place, home) else 1 if place == spare else 2,
            0 if mark.by == MARKED_BY_DAEMON else 1, -mark.last_failure)


def _beside(place: str, cni_dir: str) -> bool:
    """``place`` is ``cni_dir``'s marks directory (however either is spelled)."""
    return os.path.realpath(place) == os.path.realpath(unreleased_marks_dir(cni_dir))


def _places(dirs: Sequence[str], spare: str) -> List[str]:
    """Every marks directory: each cniDir's, then ``spare``."""
    return list(dict.fromkeys([unreleased_marks_dir(d) for d in dirs] + ([spare] if spare
                                                                          else [])))


def _every_mark(dirs: Sequence[str], spare: str) -> List[Tuple[str, FailedDelete]]:
    """(place, mark) of every mark in each cniDir's marks directory, then in ``spare``."""
    return [(place, mark) for place in _places(dirs, spare)
            for mark in read_place(place).values()]


def _clear_everywhere(dirs: Sequence[str], container_id: str, spare: str) -> bool:
    dropped = False
    for directory in dirs:
        dropped = clear(directory, container_id, spare=spare) or dropped
    return dropped


def _remove(place: str, container_id: str) -> None:
    try:
        os.unlink(os.path.join(place, container_id))
    except OSError:
        pass
