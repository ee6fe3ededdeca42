"""The stand-in API server's lists and watches of pods and NADs, as kube-apiserver serves them.

Mixed into tests/kubehandler.py's handler (:class:`ListWatchRoutes`): a LIST is answered from
the watch cache or from etcd (tests/kubecache.py decides which); a watch streams chunked JSON
events from the version it asks for: the watch cache's state first where it asks for "any"
(``resourceVersion=0``) or for a WatchList (``sendInitialEvents=true``), an ERROR event 410 (or
HTTP 410, ``expired_as_http``) from a version compacted away, "Too large resource version"
from one beyond the history, then changes and bookmarks until its ``timeoutSeconds``, an
expiry or ERROR event the test sends (tests/kubefaults.py), an ERROR storm, or the server's
stop (the stream cut without its end).
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any, Dict, Optional, Tuple

import kubecache
from kuberequests import ApiError, FieldSelector, Key, Obj, is_watch, status_object


class ListWatchRoutes:
    """The list and watch routes of the stand-in's handler (``self.server.api`` is the
    FakeKubeAPI; ``_send_json`` and ``wfile`` are the handler's)."""

    def do_route_list_pods(self, query: Dict[str, str], generation: int, ns: str = "",
                           **_: Any) -> None:
        self._list_or_watch("pods", self.server.api._pods, "PodList", "v1", query, ns, generation)

    def do_route_list_nads(self, query: Dict[str, str], generation: int, ns: str = "",
                           **_: Any) -> None:
        self._list_or_watch("nads", self.server.api._nads, "NetworkAttachmentDefinitionList",
                            "k8s.cni.cncf.io/v1", query, ns, generation)

    def _list_or_watch(self, kind: str, store: Dict[Key, Obj], list_kind: str, api_version: str,
                       query: Dict[str, str], ns: str, generation: int) -> None:
        selector = FieldSelector(query.get("fieldSelector", ""))
        selects = bool(selector.terms or query.get("labelSelector"))
        if ns:
            selector.terms.append((FieldSelector.FIELDS["metadata.namespace"], ns, True))
        api = self.server.api
        with api._cond:
            api.read_log.append((time.monotonic(), kind, is_watch(query) and  # a WatchList:
                                 query.get("sendInitialEvents", "").lower() != "true"))  # a read
        if is_watch(query):
            self._watch(kind, store, selector, query, generation,
                        (list_kind[:-len("List")], api_version))
            return
        with api._cond:  # tests/kubecache.py: from the watch cache or from etcd
            items, meta = api._answer_list(kind, store, selector, query, selects)
            between = api.between_pages if meta.get("continue") else None
            api.between_pages = None if between is not None else api.between_pages
        if between is not None:
            between()  # after this page was read, before its client can ask for the next
        self._send_json(200, {"kind": list_kind, "apiVersion": api_version, "metadata": meta,
                              "items": items})

    def _watch(self, kind: str, store: Dict[Key, Obj], selector: FieldSelector,
               query: Dict[str, str], generation: int, type_meta: Tuple[str, str]) -> None:
        api = self.server.api
        # WatchList (kube-apiserver 1.32+, client-go 0.35's informers by default): the state
        # streamed as ADDED events, then a BOOKMARK marking the end of the initial events.
        stream_list = api._watch_list(query)  # 422 for options the server refuses
        bookmarks = query.get("allowWatchBookmarks", "").lower() == "true"
        timeout = min(float(query.get("timeoutSeconds") or 1800), api.watch_timeout_cap)
        deadline = time.monotonic() + timeout
        requested = query.get("resourceVersion", "")
        with api._cond:
            compacted, expiries = api._history.compacted, api._expiries
            if not api._cache_ready():
                raise ApiError(429, "TooManyRequests", "storage is (re)initializing",
                               {"retryAfterSeconds": 1})
        if api.expired_as_http and not stream_list and requested not in ("", "0") and \
                int(requested) < compacted:
            raise ApiError(410, "Gone", f"too old resource version: {requested} ({compacted})")
        api.clients.answered(self.booking, 200)
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\nCache-Control: no-cache, private\r\n\r\n")
        try:
            with api._cond:
                api._watchers += 1
                api._cond.notify_all()
                horizon = api._horizon()
                if stream_list:  # tests/kubecache.py: the state, then the end bookmark
                    initial, sent, goes_on = api._initial_events(kind, store, selector,
                                                                 type_meta, requested)
                    deadline = deadline if goes_on else 0.0
                elif requested in ("", "0"):
                    # "any version": synthetic ADDED events for what the watch cache holds,
                    # then changes
                    initial = [("ADDED", copy.deepcopy(o))
                               for o in api._cache_objects(kind, store).values()
                               if selector.matches(o)]
                    sent = horizon
                elif int(requested) < api._history.compacted:
                    # like kube-apiserver: a 200 stream that carries one ERROR event, then ends
                    expired = status_object(410, "Expired", f"too old resource version: "
                                            f"{requested} ({api._history.compacted})")
                    initial, sent, deadline = [("ERROR", expired)], api._rv, 0.0
                elif int(requested) > api._rv:
                    # an API server whose history restarted below the client's version
                    too_large = status_object(504, "Timeout", "Too large resource version: "
                                              f"{requested}, current: {api._rv}")
                    too_large["details"] = {"causes": [{"reason": "ResourceVersionTooLarge",
                                                        "message": "Too large resource version"}],
                                            "retryAfterSeconds": 1}
                    initial, sent, deadline = [("ERROR", too_large)], api._rv, 0.0
                else:  # from that version on (silent while the watch cache is behind it)
                    initial, sent = [], int(requested)
            for etype, obj in initial:
                self._send_event(etype, obj)
            # long-running from here on; a WatchList that goes on has delivered the state
            api.clients.served(self.booking, listed=stream_list and bool(deadline))
            told = sent  # the newest version this watcher was told (an event or a bookmark)
            if deadline and self._storm_ends(kind, selector, type_meta, sent,
                                             bool(initial) or not bookmarks):
                return  # tests/kubecache.py: an ERROR storm
            due = kubecache.next_bookmark(time.monotonic(), deadline, api.bookmark_interval) \
                if bookmarks and deadline else None
            while deadline:
                with api._cond:
                    gone = lambda: api._generation != generation or not api._running  # noqa: E731
                    api._cond.wait_for(lambda: gone() or not api._blackholed)  # silent meanwhile
                    until = deadline if due is None else min(deadline, due)
                    api._cond.wait_for(lambda: gone() or api._blackholed or api._horizon() > sent
                                       or time.monotonic() >= until
                                       or api._expiries != expiries,
                                       max(0.0, until - time.monotonic()))
                    if api._blackholed and not gone():
                        continue  # a dead server says nothing, not even the end
                    if api._generation != generation or not api._running:
                        self.close_connection = True
                        return  # the server is going away: cut the stream without its end
                    if api._expiries != expiries:
                        self._send_event("ERROR", api._expiry or status_object(
                            410, "Expired", f"too old resource version: {sent} "
                            f"({api._history.compacted})"))
                        break
                    horizon = api._horizon()
                    changes = api._history.since(sent, horizon) if horizon > sent else []
                    sent = max(sent, horizon)
                for rv, entry_kind, etype, old, new in changes:
                    if entry_kind == kind and self._send_change(etype, old, new, selector):
                        told = rv
                now = time.monotonic()
                if due is not None and now >= due:
                    if sent > told:  # a bookmark no newer than what it was told is dropped
                        self._send_event("BOOKMARK", kubecache.bookmark(type_meta, sent))
                        told = sent
                    due = kubecache.next_bookmark(now, deadline, api.bookmark_interval)
                if now >= deadline:
                    break
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            with api._cond:
                api._watchers -= 1

    def _storm_ends(self, kind: str, selector: FieldSelector, type_meta: Tuple[str, str],
                    sent: int, delivered: bool) -> bool:
        """While an ERROR storm lasts (:meth:`FakeKubeAPI.error_storm`): what a plain watch
        from a version would deliver first (its replay; with nothing to replay, a bookmark if
        it allows them), then the storm's ERROR event and the end of the stream; False when no
        storm lasts. ``delivered``: it was sent something already (or takes no bookmark)."""
        api = self.server.api
        with api._cond:
            status = api._storm_status()
            if status is None:
                return False
            horizon = api._horizon()
            changes = api._history.since(sent, horizon) if horizon > sent else []
            api.storm_errors += 1
        for _rv, entry_kind, etype, old, new in changes:
            if entry_kind == kind and self._send_change(etype, old, new, selector):
                delivered = True
        if not delivered:
            self._send_event("BOOKMARK", kubecache.bookmark(type_meta, max(sent, horizon)))
        self._send_event("ERROR", status)
        self.wfile.write(b"0\r\n\r\n")
        return True

    def _send_change(self, etype: str, old: Optional[Obj], new: Optional[Obj],
                     selector: FieldSelector) -> bool:
        """Send one change as this watcher sees it; whether anything was sent."""
        # kube-apiserver turns selector transitions into ADDED/DELETED for the watcher
        was, now = selector.matches(old), selector.matches(new)
        if etype == "DELETED":
            sent = "DELETED" if was else ""
        elif was and now:
            sent = "MODIFIED"
        elif now:
            sent = "ADDED"
        else:
            sent = "DELETED" if was else ""
        if sent:
            self._send_event(sent, new)
        return bool(sent)

    def _send_event(self, etype: str, obj: Optional[Obj]) -> None:
        if etype == "ERROR":
            self.server.api.clients.errored(self.booking, int((obj or {}).get("code") or 0))
        line = json.dumps({"type": etype, "object": obj}).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
