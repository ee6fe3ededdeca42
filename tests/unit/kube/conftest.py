"""The ``run`` fixture of the reflector tests: one real Reflector thread over the stand-in.

What a reflector asked for is read off the server's request log (:meth:`Running.lists`,
:meth:`Running.watch_lists`, :meth:`Running.watches`), what it holds off its store. Nothing of
ours is patched.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List, Optional

import pytest

from kubeapi import FakeKubeAPI
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.objects import NADS_PATH, PODS_PATH, nad_from_object, pod_from_object
from multusd.kube.reflector import WATCHLIST_END_WAIT, Reflector
from multusd.kube.watchstream import WatchState
from multusd.kube.watchstream import shutdown_response


class Running:
    """One reflector thread over the stand-in, and what it holds."""

    def __init__(self, api: FakeKubeAPI, kind: str, watch_idle: Any = None,
                 state: Optional[WatchState] = None,
                 list_end_wait: float = WATCHLIST_END_WAIT) -> None:
        self.api, self.kind = api, kind
        self.config = ClientConfig(api.kubeconfig_path)
        self.state = state or WatchState(kinds=(kind,))
        self.store: Dict[Any, Any] = {}
        self.path = PODS_PATH if kind == "pods" else NADS_PATH
        base = {"fieldSelector": f"spec.nodeName={api.node}"} if kind == "pods" else {}

        def send(extra: Dict[str, Any], timeout: float, read_timeout: Any) -> Any:
            return self.config.transport.request("GET", self.path, query={**base, **extra},
                                                 timeout=timeout, read_timeout=read_timeout,
                                                 stream=True)

        trim = pod_from_object if kind == "pods" else nad_from_object
        self.reflector = Reflector(self.state, kind, kind, send, trim, self.store, self.config,
                                   5.0, watch_idle, list_end_wait)
        self.thread = threading.Thread(target=self.reflector.run, daemon=True)
        self.thread.start()

    def names(self) -> List[str]:
        with self.state.cond:
            return sorted(name for _, name in self.store)

    def synced(self, timeout: float = 10.0) -> bool:
        with self.state.cond:
            return self.state.cond.wait_for(lambda: self.state.synced[self.kind], timeout)

    def requests(self) -> List[Dict[str, str]]:
        """The queries of all its requests, oldest first."""
        return [q for m, p, q in list(self.api.requests) if p == self.path]

    def lists(self) -> List[Dict[str, str]]:
        """The queries of its LIST requests, oldest first."""
        return [q for q in self.requests() if q.get("watch") != "true"]

    def watch_lists(self) -> List[Dict[str, str]]:
        """The queries of its WatchLists (``sendInitialEvents``), oldest first."""
        return [q for q in self.requests() if q.get("sendInitialEvents") == "true"]

    def watches(self) -> List[Dict[str, str]]:
        """The queries of its plain watches, oldest first."""
        return [q for q in self.requests()
                if q.get("watch") == "true" and "sendInitialEvents" not in q]

    def reopens(self, cause: str) -> int:
        with self.state.cond:
            return self.state.reopens.get((self.kind, cause), 0)

    def stop(self) -> None:
        self.state.stop()
        with self.state.cond:
            watches = list(self.state.open_watches.values())
        for response in watches:
            shutdown_response(response)
        self.thread.join(timeout=10)
        self.config.close()


@pytest.fixture
def run(kube_api) -> Iterator[Any]:
    """``run(kind="nads", api=kube_api, **options)``: a started :class:`Running`, stopped at
    the end of the test."""
    started: List[Running] = []

    def start(kind: str = "nads", api: FakeKubeAPI = kube_api, **options: Any) -> Running:
        running = Running(api, kind, **options)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
