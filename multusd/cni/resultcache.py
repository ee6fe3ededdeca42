"""One attachment (:class:`RuntimeConf`) and libcni's result cache files, in libcni's format.

Each file, ``<cacheDir>/results/<net>-<cid>-<ifname>``, is one JSON object of kind
``cniCacheV1`` with libcni's keys, in its order: ``kind``, ``containerId``, ``config`` (base64
of the network configuration bytes), ``ifName``, ``networkName``, then when set ``netns``,
``cniArgs`` (list of [key, value]), ``capabilityArgs`` and ``result``. Files are written
through :func:`store.atomic_write` (0600 in a 0700 directory; not fsynced, as libcni does
not), so upstream multus, libcni and multusd can read each other's.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from multusd import DEFAULT_CNI_DIR, store
from multusd.errors import InvalidEnvironment, InvalidNetworkConfig, IOFailure
from multusd.store.valueclass import Record, field

LOG = logging.getLogger(__name__)

KIND = "cniCacheV1"
RESULTS_DIR = "results"


class RuntimeConf(Record):
    """One attachment: the container, its netns and interface, and per-call arguments."""

    container_id: str
    netns: str
    ifname: str
    args: Tuple[Tuple[str, str], ...] = ()
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: str = DEFAULT_CNI_DIR


def result_path(cache_dir: str, net_name: str, container_id: str, ifname: str) -> str:
    """``<cache_dir>/results/<net_name>-<container_id>-<ifname>``.

    :raises InvalidNetworkConfig: for an empty network name or one containing ``/``.
    :raises InvalidEnvironment: for an empty container ID or interface name, or one
        containing ``/`` (it would point outside the cache directory).
    """
    if not net_name or "/" in net_name:
        raise InvalidNetworkConfig(
            f"network name {net_name!r} cannot name a cache file: set a non-empty 'name' "
            "without '/' in the network configuration")
    for label, value in (("container ID", container_id), ("interface name", ifname)):
        if not value or "/" in value:
            raise InvalidEnvironment(
                f"{label} {value!r} cannot name a cache file: it must be non-empty and "
                "contain no '/'")
    return os.path.join(cache_dir, RESULTS_DIR, _file_name(net_name, container_id, ifname))


def entry_path(cache_dir: str, entry: Mapping[str, Any]) -> str:
    """The file of an entry :func:`list_entries` returned (its names are not checked again)."""
    return os.path.join(cache_dir, RESULTS_DIR, _file_name(
        entry.get("networkName"), entry.get("containerId"), entry.get("ifName")))


def write(cache_dir: str, net_name: str, rt: RuntimeConf, config_bytes: bytes,
          result: dict) -> None:
    """Record ``result`` of network ``net_name`` for the attachment ``rt`` describes.

    :raises IOFailure: when the file cannot be written.
    """
    entry: Dict[str, Any] = {
        "kind": KIND,
        "containerId": rt.container_id,
        "config": base64.b64encode(config_bytes).decode("ascii"),
        "ifName": rt.ifname,
        "networkName": net_name,
    }
    # Go's omitempty: libcni leaves these out when empty, and so do we.
    if rt.netns:
        entry["netns"] = rt.netns
    if rt.args:
        entry["cniArgs"] = [[key, value] for key, value in rt.args]
    if rt.capability_args:
        entry["capabilityArgs"] = dict(rt.capability_args)
    if result:
        entry["result"] = result
    _write_entry(result_path(cache_dir, net_name, rt.container_id, rt.ifname), entry)


def read(cache_dir: str, net_name: str, container_id: str, ifname: str) -> Optional[dict]:
    """The whole cache entry, or None when there is none (a corrupt file: None and a warning)."""
    path = result_path(cache_dir, net_name, container_id, ifname)
    entry = _load(path)
    if entry is None:
        return None
    if entry.get("kind") != KIND:
        LOG.warning("ignoring CNI cache file %s: kind %r is not %r", path, entry.get("kind"),
                    KIND)
        return None
    return entry


def read_result(cache_dir: str, net_name: str, container_id: str,
                ifname: str) -> Optional[dict]:
    """The cached result, or None. A pre-cniCacheV1 file (a bare result) is read too."""
    path = result_path(cache_dir, net_name, container_id, ifname)
    entry = _load(path)
    if entry is None:
        return None
    if entry.get("kind") == KIND:
        result = entry.get("result")
        return result if isinstance(result, dict) else None
    if "cniVersion" in entry:
        return entry  # libcni's legacy format: the file is the result itself
    LOG.warning("ignoring CNI cache file %s: neither a %s entry nor a result", path, KIND)
    return None


def update_result(cache_dir: str, net_name: str, container_id: str, ifname: str,
                  result: dict) -> None:
    """Replace the result of an existing entry, keeping everything else.

    :raises IOFailure: when there is no readable entry to update, or on write errors.
    """
    path = result_path(cache_dir, net_name, container_id, ifname)
    entry = read(cache_dir, net_name, container_id, ifname)
    if entry is None:
        raise IOFailure(
            f"cannot update the cached result of network {net_name!r} for container "
            f"{container_id!r} interface {ifname!r}: {path} is missing or unreadable")
    entry["result"] = result
    _write_entry(path, entry)


def delete(cache_dir: str, net_name: str, container_id: str, ifname: str) -> bool:
    """Remove the entry; True if it existed. A missing entry is not an error."""
    return store.remove(result_path(cache_dir, net_name, container_id, ifname))


def list_entries(cache_dir: str, container_id: str = "") -> List[dict]:
    """Every readable cniCacheV1 entry under ``cache_dir`` with a network, container and
    interface, sorted by file name (what GC walks). Unreadable files are skipped.

    :param container_id: only files whose name holds ``-<container_id>-`` are read (the
        entries of one container among others', and maybe a few more: filter on the field).
    """
    directory = os.path.join(cache_dir, RESULTS_DIR)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise IOFailure(f"cannot list the CNI cache {directory}: {exc.strerror}") from exc
    entries = []
    for name in names:
        if name.startswith(".") or (container_id and f"-{container_id}-" not in name):
            continue  # atomic_write's temp files; another container's
        entry = _load(os.path.join(directory, name))
        if (entry and entry.get("kind") == KIND and entry.get("containerId")
                and entry.get("ifName") and entry.get("networkName")):
            entries.append(entry)
    return entries


def decode_config(entry: dict) -> bytes:
    """The network configuration bytes stored in ``entry`` (base64 in the file)."""
    try:
        return base64.b64decode(entry.get("config") or "", validate=True)
    except ValueError:
        LOG.warning("CNI cache entry for %r has an invalid base64 config",
                    entry.get("networkName"))
        return b""


def _file_name(net_name: Any, container_id: Any, ifname: Any) -> str:
    return f"{net_name}-{container_id}-{ifname}"


def _write_entry(path: str, entry: dict) -> None:
    # not durable: a corrupt entry is ignored and DEL falls back to the scratch cache
    store.atomic_write(path, json.dumps(entry, separators=(",", ":")).encode(), durable=False)


def _load(path: str) -> Optional[dict]:
    return store.read_json_object(path, "CNI cache file")
