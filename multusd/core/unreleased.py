"""A DEL that keeps failing: recorded, reported for a short window, then kept as *unreleased*.

Invariant 10, a drain always finishes, fast, and nothing leaks. A DEL that fails (a
delegate's DEL error) is answered with the error, so that the runtime retries a transient
failure, only until the sandbox's window ends (``deleteRetryWindow`` from the first failure,
10 s by default: a kubelet's first retry gets success); from then on DEL answers success, so
that the pod can terminate, and nothing is forgotten: the sandbox's records (scratch and result
caches) stay, and it is *unreleased*. The journal gets a warning and the pod an Event (while
it exists: :mod:`multusd.core.unreleasedwarning`), ``multusd status``/``doctor`` and the gauge
``multusd_unreleased_sandboxes`` show it, and the daemon runs its DEL again by itself
(:mod:`multusd.daemon.delretry`: at start, then with a backoff; ``multusd gc`` at once); once
that succeeds, the records and the mark go.

What a failure is recorded in, the sandbox's mark, and where it is kept:
:mod:`multusd.core.delmarks`; which marks still stand: :mod:`multusd.core.markadoption`.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

from multusd import MARKED_BY_DAEMON, as_instant, mark_request, window_end
from multusd.core.delmarks import (FailedDelete, Failure, Released, read, set_announced,
                                   stamp, write)
from multusd.core.markadoption import node_marks
from multusd.core.unreleasedwarning import announce
from multusd.errors import MultusError

LOG = logging.getLogger(__name__)


def record(cni_dir: str, request: Any, failures: Sequence[Failure], error: str, *,
           window: float, now: Any = None, released: Sequence[Released] = (),
           spare: str = "") -> FailedDelete:
    """Record a failed DEL of ``request`` (a :class:`~multusd.core.request.CmdArgs`).

    The first failure (the shim's, if it marked the sandbox first) starts the window, of the
    ``window`` configured now; ``released`` are the delegates released so far.

    :raises IOFailure: the mark can be written neither in ``<cniDir>`` nor in ``spare``.
    """
    now = as_instant(now)
    old = read(cni_dir, request.container_id, spare=spare)
    mark = FailedDelete(
        container_id=request.container_id,
        first_failure=old.first_failure if old is not None else now[0], last_failure=now[0],
        attempts=(old.attempts if old is not None else 0) + 1, by=MARKED_BY_DAEMON,
        error=error, failures=tuple(failures), window=window,
        announced=old.announced if old is not None else False,
        request=mark_request(request.env, request.config_bytes),
        released=tuple(released), cni_dir=cni_dir,
        **_window_fields(window, old, now))
    return write(cni_dir, mark, spare, old)


def report(cni_dir: str, request: Any, failures: Sequence[Failure], msg: str, *,
           window: float, kube: Any, log: Any, released: Sequence[Released] = (),
           spare: str = "") -> None:
    """A DEL of ``request`` failed: record it, and raise ``msg`` while the sandbox's window
    lasts; past it, say once that the sandbox is unreleased and return (DEL answers success).

    A mark that cannot be written anywhere is logged; ``msg`` is raised then, never the
    I/O failure in its place (the runtime retries, as without a window).

    :raises MultusError: ``msg`` and until when it is reported.
    """
    try:
        mark = record(cni_dir, request, failures, msg, window=window, released=released,
                      spare=spare)
    except MultusError as exc:
        log.error("DEL failed and cannot be recorded as such (%s): the runtime keeps being "
                  "told, and retries", exc.msg)
        raise MultusError(f"{msg} (multusd cannot record this failure: {exc.msg})") from None
    if not mark.is_unreleased():
        raise MultusError(f"{msg}. This is reported until {stamp(mark.until)} (deleteRetryWindow "
                          f"{window:g}s after the first failure at {stamp(mark.first_failure)}); "
                          "after that DEL answers success, so that the pod can terminate, and "
                          "the sandbox stays recorded as unreleased until multusd releases it")
    if not mark.announced and announce(kube, mark, log):
        try:
            set_announced(cni_dir, mark, spare=spare)
        except MultusError as exc:  # said again next time: never a failed DEL for it
            log.warning("%s", exc.msg)
    else:
        log.info("DEL: still unreleased (%d attempts): %s; answered success, the records stay "
                 "until multusd releases them", mark.attempts, mark.what_failed())


def unreleased(cni_dirs: Sequence[str], now: Any = None, *,
               spare: str = "") -> List[FailedDelete]:
    """The unreleased sandboxes wherever the node records them (each of ``cni_dirs``, every
    cniDir the node names, and ``spare``): marks past their window whose sandbox still has
    records (:func:`~multusd.core.markadoption.node_marks`)."""
    now = as_instant(now)
    return [m for m in node_marks(cni_dirs, spare).values() if m.is_unreleased(now)]


def count_unreleased(cni_dirs: Sequence[str], *, spare: str = "") -> Optional[int]:
    """For the ``multusd_unreleased_sandboxes`` gauge; None when the marks cannot be read."""
    try:
        return len(unreleased(cni_dirs, spare=spare))
    except (OSError, MultusError) as exc:
        LOG.debug("cannot count the unreleased sandboxes in %s: %s", ", ".join(cni_dirs), exc)
        return None


# --- internals -----------------------------------------------------------------------------


def _window_fields(window: float, old: Optional[FailedDelete], now: tuple) -> Dict[str, Any]:
    end = window_end(window, old.to_json() if old is not None else None, now)
    return {"until": end["until"], "boot_id": end["bootId"],
            "until_boot": end.get("untilBoot")}
