"""Which marks of failed DELs stand: the shim's moved beside their records, released ones dropped.

A mark (:mod:`multusd.core.delmarks`) stands while its sandbox has records (a scratch cache or
a result-cache entry) where they can be: the cniDir the mark names, or the reader's (the
daemon's). Two things make one stray:

* a shim whose config names no ``cniDir`` (an operator's static 00-multus.conf, as upstream's
  needs none) marks in Multus's default directory while a daemon-config.json naming another
  one keeps the records there: unadopted, such a mark would be read by nothing of the
  daemon's (:func:`adopt` moves it beside its records);
* the sandbox was released: by the daemon's DEL, which drops the daemon's own marks but not
  the shim's copy in the default directory, or by something that drops no marks at all
  (upstream's daemon, ``gc --forget`` run outside the daemon): :func:`prune` drops them, the
  shim's in the default directory too (``records_in``: the daemon's cniDir).

The daemon's DEL retrier does both at each look, and prunes the shim's copy of a sandbox's
mark once the daemon answered its DEL (:mod:`multusd.daemon.delretry`); ``multusd gc``
prunes before it retries.
"""

from __future__ import annotations

import os
from typing import List, Sequence

from multusd.cni.resultcache import RESULTS_DIR
from multusd.core.delmarks import FailedDelete, clear, read, read_all, write
from multusd.store.valueclass import replace


def has_records(cni_dir: str, container_id: str) -> bool:
    """The sandbox still has records (a scratch cache or a result-cache entry)."""
    if os.path.exists(os.path.join(cni_dir, container_id)):
        return True
    marker = f"-{container_id}-"
    try:
        return any(marker in name for name in os.listdir(os.path.join(cni_dir, RESULTS_DIR)))
    except OSError:
        return False


def adopt(other_dir: str, cni_dir: str, *, spare: str = "") -> List[str]:
    """Move to ``cni_dir`` the marks under ``other_dir`` (Multus's default ``cniDir``) of
    sandboxes recorded in ``cni_dir`` and not there; the container IDs moved.

    A shim whose config names no ``cniDir`` (an operator's static 00-multus.conf, as upstream's
    needs none) marks in the default directory while a daemon-config.json naming another one
    keeps the records there: unadopted, such a mark would be read by nothing of the daemon's.
    A mark the daemon keeps itself for that sandbox stands; the shim's copy goes.
    """
    if os.path.realpath(other_dir) == os.path.realpath(cni_dir):
        return []
    moved = []
    for container_id, mark in read_all(other_dir).items():
        if has_records(other_dir, container_id) or not has_records(cni_dir, container_id):
            continue  # that directory's own sandbox, or one released meanwhile
        if read(cni_dir, container_id, spare=spare) is None:
            write(cni_dir, replace(mark, cni_dir=cni_dir), spare, mark)
        else:
            clear(other_dir, container_id)
        moved.append(container_id)
    return moved


def is_released(mark: FailedDelete, cni_dir: str, records_in: Sequence[str] = ()) -> bool:
    """No records of ``mark``'s sandbox are left where they can be: the cniDir the mark names,
    ``cni_dir`` (the reader's) and ``records_in``."""
    places = [mark.cni_dir or cni_dir, cni_dir, *records_in]
    return not any(has_records(place, mark.container_id) for place in dict.fromkeys(places))


def prune(cni_dir: str, *, spare: str = "", records_in: Sequence[str] = (),
          only: str = "") -> List[str]:
    """Drop the marks under ``cni_dir`` (and in ``spare``) of sandboxes that have no records
    left (:func:`is_released`: released by the daemon's DEL, another DEL, upstream's daemon, or
    ``gc --forget``); the container IDs dropped. ``records_in``: other cniDirs the records may
    be in (the daemon's, for the shim's marks in Multus's default one); ``only``: that
    container ID's mark alone."""
    if only:
        mark = read(cni_dir, only, spare=spare)
        marks = {only: mark} if mark is not None else {}
    else:
        marks = read_all(cni_dir, spare=spare)
    dropped = []
    for container_id, mark in marks.items():
        if is_released(mark, cni_dir, records_in) and clear(cni_dir, container_id, spare=spare):
            dropped.append(container_id)
    return dropped
