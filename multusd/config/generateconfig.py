"""Writing and removing ``00-multus.conf``: the ``multusd generate-config [--remove]`` oneshot.

What the file holds is :mod:`multusd.config.multusconf`'s decision; this module applies it
atomically, never rewrites unchanged bytes, re-plans when an input changed while it worked
(the path unit may drop that event), and on ``--remove`` deletes only what multusd wrote and
nobody rewrote since (:mod:`multusd.config.ownership`).

Exit codes of :func:`run`: 0 done or nothing to do yet, 1 a configuration problem, 2 an I/O
failure.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, List, Mapping, Tuple

from multusd import store
from multusd.store import read_or_none
from multusd.config.multusconf import (AUTO, CONF_DIR_MODE, CONF_MODE, DEFAULT_CNI_CONFIG_DIR,
                                       EXIT_CONFIG, EXIT_IO, EXIT_OK,
                                       MULTUS_CONF_NAME, Plan, is_candidate,
                                       load_daemon_config, plan, stat_key)
from multusd.config import ownership
from multusd.config.reader import lenient_str
from multusd.errors import ConfigError, IOFailure

LOG = logging.getLogger(__name__)

_MAX_PASSES = 3  # re-runs when an input changed while we worked (path-unit events can be lost)


def run(config_path: str, remove: bool = False) -> int:
    """``multusd generate-config [--config PATH] [--remove]``: write or remove the runtime's config.

    :returns: 0 when done or when there is nothing to do yet, 1 for a configuration problem
        (each printed to stderr as ``key: what is wrong, what to write instead``), 2 for an
        I/O failure.
    """
    try:
        if remove:
            return _remove(_load_for_remove(config_path))
        daemon_conf = load_daemon_config(config_path)
        return _generate_until_stable(daemon_conf, config_path)
    except ConfigError as exc:
        _print_problems(config_path, exc)
        return EXIT_CONFIG
    except IOFailure as exc:
        print(f"multusd generate-config: {exc.msg}; nothing was changed", file=sys.stderr)
        return EXIT_IO


def _generate_until_stable(daemon_conf: Mapping[str, Any], source: str) -> int:
    """Apply the plan; again if an input changed meanwhile (the path unit may drop that event)."""
    for _ in range(_MAX_PASSES):
        before = _fingerprint(daemon_conf)
        _apply(plan(daemon_conf, source=source))
        if _fingerprint(daemon_conf) == before:
            return EXIT_OK
        LOG.info("the primary network's files changed while generating; generating again")
    LOG.warning("the primary network's files keep changing; the next change triggers another run")
    return EXIT_OK


def _apply(decision: Plan) -> None:
    if decision.content is None:
        if os.path.exists(decision.target):
            LOG.warning("keeping %s as it is while waiting for %s (a stale config is safer "
                        "than none)", decision.target, decision.waiting_for)
        else:
            LOG.warning("not writing %s yet: waiting for %s", decision.target,
                        decision.waiting_for)
        return
    if decision.primary_rewrite is not None:
        _rewrite_primary(decision.primary, decision.primary_rewrite)
    if read_or_none(decision.target) == decision.content:
        LOG.debug("%s is up to date; not rewriting it", decision.target)
        if not ownership.is_recorded(decision.target):
            # the bytes multusd would write, never recorded: a multusd from before the record
            # wrote it. A recorded file that changed since was rewritten by someone else
            # (upstream's daemon writes the same bytes in place): it stays theirs.
            ownership.remember(decision.target)
        return
    store.atomic_write(decision.target, decision.content, mode=CONF_MODE, dir_mode=CONF_DIR_MODE)
    ownership.remember(decision.target)
    LOG.info("wrote %s%s", decision.target,
             f" for primary network {decision.primary}" if decision.primary else "")


def _rewrite_primary(path: str, content: bytes) -> None:
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = 0o644
    store.atomic_write(path, content, mode=mode, dir_mode=CONF_DIR_MODE)
    LOG.warning("forceCNIVersion is set: rewrote the primary network config %s with the "
                "daemon config's cniVersion (atomically, mode %o)", path, mode)


def _fingerprint(conf: Mapping[str, Any]) -> Tuple[Any, ...]:
    """What the plan depends on, cheaply: candidate files' identity and the readiness file."""
    readiness = lenient_str(conf, "readinessindicatorfile", "")
    parts: List[Any] = [bool(readiness) and os.path.exists(readiness)]
    directory = lenient_str(conf, "multusAutoconfigDir", "")
    static = lenient_str(conf, "multusConfigFile", "")
    if static not in ("", AUTO):
        parts.append(stat_key(static))
    elif directory:
        try:
            names = sorted(n for n in os.listdir(directory) if is_candidate(directory, n))
        except OSError:
            names = []
        parts.extend((n, stat_key(os.path.join(directory, n))) for n in names)
    return tuple(parts)


def _load_for_remove(config_path: str) -> Mapping[str, Any]:
    """At package removal the daemon config may be gone or broken: fall back to defaults."""
    try:
        return load_daemon_config(config_path)
    except ConfigError as exc:
        LOG.warning("%s; removing with the default cniConfigDir %s", exc.msg,
                    DEFAULT_CNI_CONFIG_DIR)
        return {}


def _remove(conf: Mapping[str, Any]) -> int:
    """Delete what multusd wrote (00-multus.conf, a static copy) if nobody changed it since."""
    cni_dir = lenient_str(conf, "cniConfigDir", "") or DEFAULT_CNI_CONFIG_DIR
    candidates = [os.path.join(cni_dir, MULTUS_CONF_NAME)]
    static = lenient_str(conf, "multusConfigFile", AUTO)
    if static not in ("", AUTO) and os.path.isabs(static):
        copy = os.path.join(cni_dir, os.path.basename(static))
        if os.path.abspath(copy) != os.path.abspath(static) and copy not in candidates:
            candidates.append(copy)
    for path in candidates:
        if not os.path.lexists(path):
            LOG.info("%s does not exist; nothing to remove", path)
        elif not ownership.is_ours(path):
            LOG.warning("leaving %s in place: multusd did not write it, or it was rewritten "
                        "since (by upstream Multus, its installer or an operator)", path)
        else:
            store.remove(path)
            ownership.forget(path)
            LOG.info("removed %s", path)
    return EXIT_OK


def _print_problems(config_path: str, exc: ConfigError) -> None:
    lines = [f"multusd generate-config: {len(exc.problems)} problem(s) with {config_path}; "
             "nothing was written:"]
    lines.extend(f"  {problem.format()}" for problem in exc.problems)
    print("\n".join(lines), file=sys.stderr)
