"""The failures a reflector's round can end in, and what its next round asks for after each.

A round of :class:`multusd.kube.reflector.Reflector` is one sync (a WatchList, or a LIST and
the watch from its version) or one watch, followed until it ends. It fails unless it was a
watch that the server ended after it lived (:data:`YOUNG`: one it ended within
:data:`multusd.kube.rounds.YOUNG_WATCH`, news or not, is a failure; client-go counts only
one that ended within a second without an event). Whatever came before a failure in the
stream (news, a whole WatchList), every failure waits on the reflector's one backoff
(:data:`multusd.kube.retries.API_SERVER`); what it was decides what the next round asks for
(:func:`plan`, pure) and the label it is counted under, and how it is waited for in two
cases only (:meth:`multusd.kube.rounds.Rounds.wait_after`): a watch's expiry after a
watch that worked is relisted at once, and a server that says it is starting
(:data:`STARTING`) is asked again on the curve's first step (failure-style §4, client-go's
``ListAndWatch``).

* :func:`kind_of`: which of :data:`KINDS` an exception is; :func:`starting`: whether an
  answer is a server's that is starting up;
* :func:`plan`: after a failure of a kind, in a sync or in a watch: read the whole state again
  (an ERROR event, an expiry: client-go's relist; a starting server, whose new watch cache
  will not hold the version a watch would resume from), and where the version is of no use
  (410 or "too large" answered to a sync at that version, "too large" anywhere) from the
  current state (``resourceVersion`` unset), never the same request again; the cache known
  stale (an expiry found by a watch, until a list replaces it).
"""

from __future__ import annotations

import http.client
from typing import NamedTuple

from multusd.kube.clientconfig import WatchError
from multusd.kube.transport import ApiError, IdleTimeout
from multusd.kube.watchstream import Expired, TooLarge, status_of, too_large_error

UNREACHABLE = "unreachable"  # no answer: refused, reset, cut, timed out, a TLS failure
ANSWERED = "answered"  # an HTTP error answer: 429, 5xx, 401, 403, 404 ...
EVENT = "event"  # an ERROR event other than an expiry (500 "etcdserver: leader changed" ...)
EXPIRED = "expired"  # 410: the version asked for has left the server's history
TOO_LARGE = "too-large"  # the server's history is behind the version asked for
YOUNG = "young"  # a watch the server ended within YOUNG_WATCH of its answer
UNFINISHED = "unfinished"  # a WatchList ended before the bookmark that ends its initial events
SILENT = "silent"  # a stream silent past its bound (a dead peer, a stalled WatchList)
NO_WATCH_LIST = "no-watch-list"  # the server does not stream lists (refused, or ignored)
MALFORMED = "malformed"  # an answer that is not what it should be (its JSON, its chunks)
UNEXPECTED = "unexpected"  # anything else: a bug, logged with its traceback
# a server that is starting up: 429 "storage is (re)initializing", or 403 to a request it served
# before (its authorizer has not loaded the roles yet): see starting()
STARTING = "starting"
KINDS = (UNREACHABLE, ANSWERED, EVENT, EXPIRED, TOO_LARGE, YOUNG, UNFINISHED, SILENT,
         NO_WATCH_LIST, MALFORMED, UNEXPECTED, STARTING)
# what kube-apiserver's watch cache answers (429, Retry-After 1) until it has initialised
INITIALIZING = "(re)initializing"

# the label a failed watch is counted under (multusd_watch_reopens_total: REOPEN_CAUSES)
CAUSES = {UNREACHABLE: "connection", ANSWERED: "error", EVENT: "error", EXPIRED: "expired",
          TOO_LARGE: "expired", YOUNG: "ended", UNFINISHED: "ended", SILENT: "silence",
          NO_WATCH_LIST: "error", MALFORMED: "error", UNEXPECTED: "error", STARTING: "error"}


class NoWatchList(Exception):
    """The server does not stream lists (WatchList): it refused the request, refused it in
    the stream, or ignored ``sendInitialEvents`` (no end bookmark in time)."""


class Unfinished(Exception):
    """A WatchList the server ended (cleanly) before the bookmark that ends its initial
    events: the state it sent is incomplete and was not used."""


class Plan(NamedTuple):
    """What the round after a failure asks for."""

    relist: bool  # read the whole state again (else: as before, a watch resumes its version)
    consistent: bool  # ... from the current state: the version known is of no use
    stale: bool  # the cache is known stale from now on, until a list replaces it
    cause: str  # the label of the watch it ended (REOPEN_CAUSES)


def starting(exc: BaseException, served: bool = False) -> bool:
    """An answer of a server that is starting up (kube-apiserver before its /readyz is ok),
    whose refusal says nothing that lasts: 429 whose Status says its storage is
    "(re)initializing" (the watch cache, as an answer or an ERROR event), or, where the server
    has ``served`` this very request before (a list or watch answered), 403 Forbidden: an
    authorizer that has not loaded its roles yet answers as RBAC does, nothing in the answer
    tells them apart, and roles that allowed a request rarely vanish. A 403 that lasts is a
    refusal again (:attr:`multusd.kube.retries.Delays.starting_spent`)."""
    status = getattr(exc, "status", None)
    if status == 429:
        message = status_of(exc).get("message") or getattr(exc, "reason", "")
        return INITIALIZING in str(message)
    return status == 403 and served


def kind_of(exc: BaseException, served: bool = False) -> str:
    """Which of :data:`KINDS` a round's exception is; ``served``: the server answered this
    reflector's list or watch before (:func:`starting`)."""
    if isinstance(exc, TooLarge):
        return TOO_LARGE
    if isinstance(exc, Expired):
        return EXPIRED
    if isinstance(exc, NoWatchList):
        return NO_WATCH_LIST
    if isinstance(exc, Unfinished):
        return UNFINISHED
    if isinstance(exc, WatchError):
        return STARTING if starting(exc) else EVENT
    if isinstance(exc, IdleTimeout):
        return SILENT
    if isinstance(exc, ApiError):
        if exc.status == 410:
            return EXPIRED
        if too_large_error(exc):
            return TOO_LARGE
        return STARTING if starting(exc, served) else ANSWERED
    if isinstance(exc, (OSError, http.client.HTTPException)):
        return UNREACHABLE
    if isinstance(exc, ValueError):
        return MALFORMED
    return UNEXPECTED


def plan(kind: str, syncing: bool) -> Plan:
    """What the next round asks for after a failure of ``kind`` (:data:`KINDS`).

    :param syncing: it failed while reading the whole state (a LIST, or a WatchList before
        the end of its initial events), at the reflector's last version if it had one.
    """
    cause = CAUSES.get(kind, "error")
    if kind == TOO_LARGE or (kind == EXPIRED and syncing):
        # the version is of no use: from the current state, never the same request again
        return Plan(relist=True, consistent=True, stale=not syncing, cause=cause)
    if kind == EXPIRED:  # a watch's history is gone: the whole state again, at that version
        return Plan(relist=True, consistent=False, stale=True, cause=cause)
    if kind == STARTING:  # its new watch cache begins after the version a watch resumes from
        return Plan(relist=True, consistent=False, stale=False, cause=cause)
    # an ERROR event ends in a relist (client-go), so does a refused WatchList (as a LIST);
    # anything else asks again for what failed: a sync, or the watch from its version
    relist = syncing or kind in (EVENT, NO_WATCH_LIST)
    return Plan(relist=relist, consistent=False, stale=False, cause=cause)
