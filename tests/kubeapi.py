"""A small, real Kubernetes API server for tests: pods, NetworkAttachmentDefinitions, events.

The only stand-in in multusd's test suite. It is a real HTTP/1.1 server (standard library, in a
thread, on 127.0.0.1 with an ephemeral port) that speaks enough of the Kubernetes REST API for
the real ``kubernetes`` client to work against it:

* pods: list and chunked watch (cluster-wide or per namespace, ``fieldSelector`` on
  ``spec.nodeName``/``metadata.name``/``metadata.namespace``), GET, and ``PUT .../status`` with
  kube-apiserver's status-subresource rules (spec, ownerReferences and deletionTimestamp keep
  their stored values; metadata such as annotations and the status are taken from the body;
  409 on a stale resourceVersion or a different UID);
* NetworkAttachmentDefinitions: list and watch in all namespaces, GET one;
* events: ``POST`` to core/v1 and events.k8s.io/v1, kept in :attr:`FakeKubeAPI.events`;
* resource.k8s.io/v1 (DRA): ResourceClaims and ResourceSlices with their field selectors
  (tests/kubedra.py);
* nodes: GET one (the server's own node exists from the start; :meth:`add_node`,
  :meth:`delete_node`); SelfSubjectAccessReview (``POST`` to authorization.k8s.io/v1);
* RBAC in a small way: everything is allowed until :meth:`deny` takes a (verb, resource)
  away, after which reviews answer ``allowed: false`` and real requests 403 Forbidden;
* one increasing resourceVersion shared by every object (like etcd's revision); lists are read
  from the watch cache (``resourceVersion=0`` or not older than N: a state that may lag behind
  the newest write) or from etcd (consistent and exact reads, ``limit``/``continue`` pages
  whose token can expire), counted by source: tests/kubecache.py says which is which;
  watches resume from a resourceVersion and answer an ERROR event with 410 Gone once it was
  compacted away, and send bookmarks as kube-apiserver does (every minute, and 2 s before
  their ``timeoutSeconds``); a watch with ``sendInitialEvents=true`` (WatchList, what
  client-go 0.35's informers open) streams the objects as ADDED, then the BOOKMARK annotated
  ``k8s.io/initial-events-end`` (or is refused or ignored as older servers do:
  :attr:`watch_list`);
* bearer-token auth (401 without it), optional TLS with a throw-away CA made by ``openssl``;
* request bodies in JSON, or in Kubernetes' protobuf (``Content-Type:
  application/vnd.kubernetes.protobuf``, what client-go clients such as upstream Multus's
  send; tests/kubeproto.py decodes the Pod and Event fields used here); answers are JSON.

Per client (the user its token or certificate names): requests, response bytes and whether each
LIST was a watch-cache or a storage read, in :attr:`FakeKubeAPI.clients` (tests/kubeclients.py).

Test controls: :meth:`add_pod`, :meth:`update_pod`, :meth:`delete_pod`, :meth:`add_nad`,
:meth:`delete_nad`, :meth:`pod`, :attr:`events`, :attr:`requests`, :meth:`stop`/:meth:`start`
(same port; stopped, connections are refused), :meth:`fail_next` (an error status, with or
without ``Retry-After``, or a connection cut after the request was read: RST or a close
without an answer, a TLS EOF over TLS), :meth:`trickle` (the next answers to a path, or all
of them for a while, sent slowly: the status line late, then a byte every half second, as an
overloaded server or a congested link does; :attr:`trickled` says how each ended),
:meth:`fail_connections` (the next connections cut as
they are accepted, before the request and the TLS handshake), :attr:`connections_accepted`,
:meth:`compact`, :meth:`deny` and :attr:`kubeconfig_path`; ``host="::1"`` listens on IPv6
(the TLS certificate names 127.0.0.1, ::1 and localhost); watch
expiry: :meth:`expire_watches` (ERROR 410 in open streams; :meth:`fail_watches`: any ERROR
event), :attr:`expired_as_http` (HTTP 410 at the start of a watch from a compacted version)
and :meth:`restart` with ``lose_history`` or ``new_watch_cache``; reads:
:meth:`hold_watch_cache`, :attr:`watch_cache_ready`, :attr:`list_reads`,
:meth:`count_list_reads`, :attr:`bookmark_interval` (tests/kubecache.py).

Usage::

    def test_something(kube_api):
        kube_api.add_pod("default", "web", node=kube_api.node)
        client = KubeClient(kube_api.kubeconfig_path, kube_api.node)

Every response goes out in one write on a TCP_NODELAY socket: with the header and the body in
two writes, each keep-alive request would pay the ~40 ms of Nagle's algorithm meeting delayed
ACKs.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

import pytest

import kubecache
import kubeclients
import kubedra
import kubeproto
from kubeauth import Authenticator, ClientCertificates, node_restriction

DEFAULT_TOKEN = "fake-kube-token-8c1d2f7e6b5a4930"
DEFAULT_NODE = "node-a"
NAD_GROUP_PATH = "/apis/k8s.cni.cncf.io/v1"
CONFIG_SOURCE = "kubernetes.io/config.source"

Obj = Dict[str, Any]
Key = Tuple[str, str]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_object(code: int, reason: str, message: str) -> Obj:
    """A metav1.Status failure body, as kube-apiserver sends with every error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ApiError(Exception):
    """Raised inside a handler: becomes a Status response with this code."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Optional[Obj] = None, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status_object(code, reason, message)
        self.headers = headers or {}
        if details is not None:
            self.status["details"] = details


def not_found(resource: str, name: str) -> ApiError:
    """kube-apiserver's NotFound of one object: ``details`` name it (a missing resource type
    has no ``details.name``)."""
    plural, _, group = resource.partition(".")
    return ApiError(404, "NotFound", f'{resource} "{name}" not found',
                    {"name": name, "group": group, "kind": plural})


class _FieldSelector:
    """``fieldSelector`` terms of the form ``field=value``/``field==value``/``field!=value``."""

    FIELDS: Dict[str, Callable[[Obj], str]] = {
        "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName", ""),
        "metadata.name": lambda o: o["metadata"]["name"],
        "metadata.namespace": lambda o: o["metadata"]["namespace"],
    }

    def __init__(self, text: str) -> None:
        self.terms: List[Tuple[Callable[[Obj], str], str, bool]] = []
        for term in filter(None, (t.strip() for t in text.split(","))):
            match = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)
            if not match or match.group(1) not in self.FIELDS:
                raise ApiError(400, "BadRequest", f'"{term}" is not a known field selector: '
                               f"only {sorted(self.FIELDS)} are supported")
            field, op, value = match.groups()
            self.terms.append((self.FIELDS[field], value, op != "!="))

    def matches(self, obj: Optional[Obj]) -> bool:
        if obj is None:
            return False
        return all((get(obj) == value) == equal for get, value, equal in self.terms)


class FakeKubeAPI(kubecache.ReadPaths, kubedra.DraStore):
    """The fake API server and its test controls. Thread-safe; see the module docstring."""

    def __init__(self, workdir: str, *, token: str = DEFAULT_TOKEN, node: str = DEFAULT_NODE,
                 tls: bool = False, token_file: bool = False, user: str = "",
                 client_certs: bool = False, host: str = "127.0.0.1") -> None:
        self.workdir = workdir
        self.node = node
        self.host = host  # where it listens: "::1" for an IPv6 API server
        self.tls = tls or client_certs
        self.token_file = token_file
        self.user = user or RBAC_USER  # who the token is ("system:node:<node>": NodeRestriction)
        self.auth = Authenticator(token, self.user)
        self.certs: Optional[ClientCertificates] = None
        # the NetworkAttachmentDefinition CRD: False answers its paths 404 (not installed)
        self.nad_crd_installed = True
        self._blackholed = False
        self.port = 0
        self.requests: List[Tuple[str, str, Dict[str, str]]] = []
        self.events: List[Obj] = []
        self.clients = kubeclients.ClientLedger()  # per client: requests, bytes, cache reads
        self._cond = threading.Condition()
        self._rv = 1
        self._pods: Dict[Key, Obj] = {}
        self._nads: Dict[Key, Obj] = {}
        self._init_reads()
        self._init_dra()
        self._failures: List[Dict[str, Any]] = []
        self._trickles: List[Dict[str, Any]] = []
        self._trickle_epoch = 0  # bumped by clear_failures(): answers trickling now stop
        self.trickles_begun = 0  # trickled answers begun so far
        # (path, "whole" | "client gone" | "stopped") of each trickled answer, once it ended
        self.trickled: List[Tuple[str, str]] = []
        self._connection_faults: List[str] = []  # cuts of the next accepted connections
        self.connections_accepted = 0  # TCP connections accepted (TLS: handshakes begun)
        self._nodes: set = {node}
        self._denied: set = set()  # (verb, group, resource[/subresource])
        self._generation = 0  # bumped by stop(): watches of an earlier run end
        self._running = False
        self._watchers = 0  # watch streams open now
        self._expiries = 0  # bumped by expire_watches()/fail_watches(): open watches end ...
        self._expiry: Optional[Obj] = None  # ... with this ERROR event (None: 410 Expired)
        # expired_as_http: a watch from a compacted version is answered HTTP 410 at its
        # start instead of a 200 stream carrying an ERROR event (both happen in real clusters)
        self.expired_as_http = False
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._connections: set = set()
        self._ssl_context: Optional[ssl.SSLContext] = None
        self.ca_path: Optional[str] = None
        if self.tls:
            self._ssl_context = self._make_tls()
        if client_certs:
            self.certs = ClientCertificates(os.path.join(workdir, "pki"), node)
            self.certs.server_context(self._ssl_context)
            self.auth.certificates = self.certs

    @property
    def token(self) -> str:
        """The bearer token the server accepts now (see :meth:`rotate_token`)."""
        return self.auth.token

    def rotate_token(self, new: Optional[str] = None, *, keep_old: bool = False,
                     write_files: bool = True) -> str:
        """Replace the token (in every token file written, unless not ``write_files``) and
        reject the old one (unless ``keep_old``)."""
        return self.auth.rotate_token(new or f"rotated-{uuid.uuid4().hex}", keep_old=keep_old,
                                      write_files=write_files)

    def rotate_client_cert(self) -> str:
        """The kubelet's certificate rotation: a new pair behind kubelet-client-current.pem,
        the old certificate revoked (401 on connections that still present it)."""
        assert self.certs is not None, "start the server with client_certs=True"
        return self.certs.rotate()

    def blackhole(self, on: bool = True) -> None:
        """An API server that stops answering but keeps connections open: requests wait
        without an answer and open watches fall silent, until ``blackhole(False)``."""
        with self._cond:
            self._blackholed = on
            self._cond.notify_all()

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def start(self) -> "FakeKubeAPI":
        """Serve (again) on the same port; the store and its resourceVersions are kept."""
        if self._running:
            return self
        server_class = _Server6 if ":" in self.host else _Server
        httpd = server_class((self.host, self.port), _Handler)
        httpd.api = self
        httpd.generation = self._generation
        httpd.tls = self._ssl_context  # the handshake follows accept(): see _Server.get_request
        self.port = httpd.server_address[1]
        with self._cond:
            self._running = True
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"kubeapi:{self.port}", daemon=True)
        self._thread.start()
        self._write_kubeconfig()
        return self

    def stop(self) -> None:
        """Go away like a crashed API server: stop listening and cut every open connection."""
        httpd = self._httpd
        if httpd is None:
            return
        with self._cond:
            self._running = False
            self._generation += 1
            self._cond.notify_all()
        httpd.shutdown()
        httpd.server_close()
        with self._cond:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    # ---- kubeconfig and TLS ----------------------------------------------------------------

    @property
    def kubeconfig_path(self) -> str:
        return os.path.join(self.workdir, "kubeconfig")

    def write_kubeconfig(self, path: str, *, token: Optional[str] = None) -> str:
        """Write a kubeconfig for this server (optionally with another token) at ``path``."""
        user: Obj = {}
        token = self.token if token is None else token
        if self.certs is not None:  # the kubelet's own kubeconfig: one PEM with cert and key
            user["client-certificate"] = user["client-key"] = self.certs.current
        elif self.token_file:
            token_path = path + ".token"
            with open(token_path, "w", encoding="utf-8") as handle:
                handle.write(token + "\n")
            user["tokenFile"] = token_path
            if token == self.token and token_path not in self.auth.token_files:
                self.auth.token_files.append(token_path)
        else:
            user["token"] = token
        cluster: Obj = {"server": self.url}
        if self.ca_path:
            cluster["certificate-authority"] = self.ca_path
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "multusd", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "multusd"}}],
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)  # JSON is YAML: the client's loader reads it
        return path

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig_path)

    def _make_tls(self) -> ssl.SSLContext:
        cert = os.path.join(self.workdir, "apiserver.crt")
        key = os.path.join(self.workdir, "apiserver.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=fake-kube-apiserver", "-addext",
                        "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.ca_path = cert  # self-signed: the certificate is its own CA
        return context

    # ---- test controls: objects ------------------------------------------------------------

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def add_pod(self, namespace: str, name: str, uid: Optional[str] = None, *,
                node: Optional[str] = None, annotations: Optional[Dict[str, str]] = None,
                static: bool = False, labels: Optional[Dict[str, str]] = None,
                spec: Optional[Obj] = None, status: Optional[Obj] = None) -> Obj:
        """Create a pod (scheduled on ``node``, default this server's node); returns a copy.

        ``spec`` and ``status`` keys are added to the pod's (``resourceClaims``,
        ``resourceClaimStatuses``...), so that the pod exists with them from the start."""
        annotations = dict(annotations or {})
        if static:
            annotations.setdefault(CONFIG_SOURCE, "file")
            annotations.setdefault("kubernetes.io/config.mirror", uuid.uuid4().hex)
        pod: Obj = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                "creationTimestamp": _now(), "annotations": annotations,
                "labels": dict(labels or {"app": name}),
                "ownerReferences": [] if static else [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-rs",
                     "uid": str(uuid.uuid4()), "controller": True}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                   "apiVersion": "v1", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {}}}],
            },
            "spec": {
                "nodeName": self.node if node is None else node,
                "containers": [{"name": "main", "image": "registry.invalid/app:1",
                                "command": ["/app"], "env": [{"name": "A", "value": "1"}]}],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        pod["spec"].update(copy.deepcopy(spec or {}))
        pod["status"].update(copy.deepcopy(status or {}))
        with self._cond:
            key = (namespace, name)
            if key in self._pods:
                raise ValueError(f"pod {namespace}/{name} already exists in the fake API")
            pod["metadata"]["resourceVersion"] = self._bump()
            self._pods[key] = pod
            self._history.record(self._rv, "pods", "ADDED", None, pod)
            self._cond.notify_all()
            return copy.deepcopy(pod)

    def update_pod(self, namespace: str, name: str, *,
                   annotations: Optional[Dict[str, Optional[str]]] = None,
                   node: Optional[str] = None, phase: Optional[str] = None,
                   labels: Optional[Dict[str, str]] = None, terminating: bool = False) -> Obj:
        """Change a pod like another client would (annotation value None removes the key);
        ``terminating``: as a graceful delete begins (deletionTimestamp set, pod kept)."""
        with self._cond:
            old = self._pods[(namespace, name)]
            pod = copy.deepcopy(old)
            for key, value in (annotations or {}).items():
                if value is None:
                    pod["metadata"]["annotations"].pop(key, None)
                else:
                    pod["metadata"]["annotations"][key] = value
            if node is not None:
                pod["spec"]["nodeName"] = node
            if phase is not None:
                pod["status"]["phase"] = phase
            if labels is not None:
                pod["metadata"]["labels"] = dict(labels)
            if terminating:
                pod["metadata"].setdefault("deletionTimestamp", _now())
            return copy.deepcopy(self._store_update("pods", self._pods, old, pod))

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            self._delete("pods", self._pods, (namespace, name))

    def pod(self, namespace: str, name: str) -> Optional[Obj]:
        """The stored pod as the API server has it now (a copy), or None."""
        with self._cond:
            pod = self._pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def add_nad(self, namespace: str, name: str, config: str, *,
                annotations: Optional[Dict[str, str]] = None) -> Obj:
        """Create or replace a NetworkAttachmentDefinition whose spec.config is ``config``."""
        with self._cond:
            key = (namespace, name)
            old = self._nads.get(key)
            nad: Obj = {
                "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": name, "namespace": namespace,
                             "uid": old["metadata"]["uid"] if old else str(uuid.uuid4()),
                             "creationTimestamp": _now(), "annotations": dict(annotations or {})},
                "spec": {"config": config},
            }
            if old is not None:
                return copy.deepcopy(self._store_update("nads", self._nads, old, nad))
            nad["metadata"]["resourceVersion"] = self._bump()
            self._nads[key] = nad
            self._history.record(self._rv, "nads", "ADDED", None, nad)
            self._cond.notify_all()
            return copy.deepcopy(nad)

    def delete_nad(self, namespace: str, name: str) -> None:
        with self._cond:
            self._delete("nads", self._nads, (namespace, name))

    def add_node(self, name: str) -> None:
        with self._cond:
            self._nodes.add(name)

    def delete_node(self, name: str) -> None:
        with self._cond:
            self._nodes.discard(name)

    def deny(self, verb: str, resource: str, group: str = "") -> None:
        """Take ``verb`` on ``resource`` (``pods``, ``pods/status``, ...) in ``group`` away from
        the kubeconfig's user: reviews say so and matching requests get 403 Forbidden."""
        with self._cond:
            self._denied.add((verb, group, resource))

    def allowed(self, verb: str, group: str, resource: str) -> bool:
        with self._cond:
            return (verb, group, resource) not in self._denied

    def compact(self) -> None:
        """Forget the change history: watches resuming from an older version get 410 Gone,
        and so do reads and ``continue`` tokens at an older version."""
        with self._cond:
            self._history.compact(self._rv, self._horizon())

    # ---- test controls: watch expiry (410 Gone in its three forms) --------------------------

    def expire_watches(self) -> int:
        """Send an ERROR event with code 410 into every open watch stream now, then end them
        (etcd compacted the history while they were open); returns how many were open."""
        with self._cond:
            self._history.compact(self._rv, self._horizon())
            self._expiries += 1
            self._expiry = None
            self._cond.notify_all()
            return self._watchers

    def fail_watches(self, code: int, reason: str, message: str) -> int:
        """Send an ERROR event with this Status into every open watch stream now, then end
        them (what kube-apiserver sends when a watch fails: etcd or the cacher broke it);
        returns how many were open."""
        with self._cond:
            self._expiries += 1
            self._expiry = status_object(code, reason, message)
            self._cond.notify_all()
            return self._watchers

    def restart(self, *, lose_history: bool = False, new_watch_cache: bool = False) -> None:
        """Stop and start on the same port; with ``lose_history`` the API server comes back
        with a new etcd: objects kept, resourceVersions restarted from 1, no watch history.

        A watch resuming from a version the new history does not reach gets what
        kube-apiserver sends: an ERROR event "Too large resource version" (code 504, cause
        ResourceVersionTooLarge) when it is ahead, 410 Gone when it is behind.

        With ``new_watch_cache`` it comes back as a real kube-apiserver does after a restart
        (etcd kept): its new watch cache starts at the newest version, so a watch resuming
        from an older one gets 410 (the reflectors relist).
        """
        self.stop()
        with self._cond:
            if lose_history:
                self._rv = 1
                for store in (self._pods, self._nads):
                    for obj in store.values():
                        obj["metadata"]["resourceVersion"] = self._bump()
                self._history = kubecache.History()
                self._history.compacted = self._rv
                self._cache_held = None
            if new_watch_cache:
                self._history.compact(self._rv)
                self._cache_held = None
        self.start()

    def _store_update(self, kind: str, store: Dict[Key, Obj], old: Obj, new: Obj) -> Obj:
        new["metadata"]["resourceVersion"] = self._bump()
        store[(new["metadata"]["namespace"], new["metadata"]["name"])] = new
        self._history.record(self._rv, kind, "MODIFIED", old, new)
        self._cond.notify_all()
        return new

    def _delete(self, kind: str, store: Dict[Key, Obj], key: Key) -> None:
        old = store.pop(key, None)
        if old is None:
            raise KeyError(f"no {kind} {key[0]}/{key[1]} in the fake API")
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self._bump()
        self._history.record(self._rv, kind, "DELETED", old, gone)
        self._cond.notify_all()

    # ---- test controls: requests and failures ----------------------------------------------

    def fail_next(self, method: str, path_prefix: str, status: int = 0, *,
                  times: Optional[int] = 1, watch: Optional[bool] = None,
                  retry_after: Optional[Any] = None, drop: str = "",
                  processed: bool = False, initial_events: Optional[bool] = None) -> None:
        """Answer the next ``times`` matching requests (None: all of them) with ``status``.

        ``watch`` narrows the match to watch (True) or non-watch (False) requests,
        ``initial_events`` to WatchLists (True: ``sendInitialEvents=true``) or others.
        ``retry_after`` adds a ``Retry-After`` header (and, as kube-apiserver, the Status's
        ``details.retryAfterSeconds`` when it is a number). Instead of an answer, ``drop``
        cuts the connection once the request was read: ``"reset"`` (RST: SO_LINGER 0) or
        ``"close"`` (FIN without an answer; over TLS without close_notify: a TLS EOF); with
        ``processed`` the request is carried out first and only its answer is lost.
        Failures queued for the same requests are used in the order queued.
        """
        assert drop in ("", "reset", "close") and (status or drop), (status, drop)
        with self._cond:
            self._failures.append({"method": method.upper(), "prefix": path_prefix,
                                   "status": status, "times": times, "watch": watch,
                                   "retry_after": retry_after, "drop": drop,
                                   "processed": processed, "initial_events": initial_events})

    def trickle(self, method: str, path_prefix: str, *, times: Optional[int] = 1,
                seconds: Optional[float] = None, head_after: float = 1.0,
                interval: float = 0.5) -> None:
        """Answer the next ``times`` matching requests (lists and GETs, not watches) slowly;
        with ``seconds``, every matching request for that long instead.

        The answer is the right one, but its status line goes out ``head_after`` seconds
        late and then the rest one byte every ``interval`` seconds: a client that bounds
        each read, not the whole request, waits as long as the server likes. How each one
        ended is appended to :attr:`trickled` (``"whole"``, ``"client gone"``, or
        ``"stopped"`` by :meth:`clear_failures` or :meth:`stop`).
        """
        with self._cond:
            self._trickles.append({
                "method": method.upper(), "prefix": path_prefix,
                "times": None if seconds is not None else times,
                "until": None if seconds is None else time.monotonic() + seconds,
                "head_after": head_after, "interval": interval})

    def wait_trickling(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until ``count`` trickled answers have begun (a synchronisation point)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.trickles_begun >= count, timeout)

    def fail_connections(self, how: str, times: int = 1) -> None:
        """Cut the next ``times`` connections as they are accepted, before reading a
        request or starting TLS: ``"reset"`` (RST) or ``"close"`` (FIN; over TLS the client's
        handshake meets EOF: what a load balancer in front of a restarting server does)."""
        assert how in ("reset", "close"), how
        with self._cond:
            self._connection_faults.extend([how] * times)

    def clear_failures(self) -> None:
        """Forget the failures queued, and stop trickling (answers trickling now are cut)."""
        with self._cond:
            self._failures.clear()
            self._connection_faults.clear()
            self._trickles.clear()
            self._trickle_epoch += 1
            self._cond.notify_all()

    def count(self, method: Optional[str] = None, path_prefix: str = "",
              watch: Optional[bool] = None) -> int:
        """How many requests matched (method, path prefix, watch or not)."""
        with self._cond:
            return sum(1 for m, path, query in self.requests
                       if (method is None or m == method.upper()) and path.startswith(path_prefix)
                       and (watch is None or _is_watch(query) == watch))

    def wait_for_watchers(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until ``count`` watch streams are open (a test synchronisation point)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._watchers >= count, timeout)

    def _take_trickle(self, method: str, path: str,
                      query: Dict[str, str]) -> Optional[Dict[str, Any]]:
        """The trickle a request's answer gets (call with ``_cond`` held), or None."""
        if _is_watch(query):
            return None
        now = time.monotonic()
        self._trickles[:] = [t for t in self._trickles if t["until"] is None or now < t["until"]]
        for trickle in self._trickles:
            if trickle["method"] != method or not path.startswith(trickle["prefix"]):
                continue
            if trickle["times"] is not None:
                trickle["times"] -= 1
                if trickle["times"] <= 0:
                    self._trickles.remove(trickle)
            return dict(trickle, epoch=self._trickle_epoch)
        return None

    def _take_failure(self, method: str, path: str,
                      query: Dict[str, str]) -> Optional[Dict[str, Any]]:
        for failure in self._failures:
            if failure["method"] != method or not path.startswith(failure["prefix"]):
                continue
            if failure["watch"] is not None and failure["watch"] != _is_watch(query):
                continue
            if failure["initial_events"] is not None and failure["initial_events"] != (
                    query.get("sendInitialEvents", "").lower() == "true"):
                continue
            if failure["times"] is not None:
                failure["times"] -= 1
                if failure["times"] <= 0:
                    self._failures.remove(failure)
            return dict(failure)
        return None


def _is_watch(query: Dict[str, str]) -> bool:
    return query.get("watch", "").lower() in ("true", "1")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # socketserver's 5 drops SYNs of a burst (1 s retransmits);
    # a fleet reconnects at once after a restart
    api: FakeKubeAPI
    generation: int  # FakeKubeAPI._generation when this run started
    tls: Optional[ssl.SSLContext] = None

    def server_activate(self) -> None:
        super().server_activate()
        # accept(2): a connection reset between the readiness poll and accept() leaves the
        # queue, and a blocking accept() would then wait for the next one, holding
        # serve_forever (and stop()) until then. Non-blocking, it raises and the loop goes on.
        self.socket.setblocking(False)

    def get_request(self) -> Tuple[socket.socket, Any]:
        """Accept; cut the connection when the test asked for it, else start TLS (the
        handshake runs here, as it did inside an SSL listening socket's accept())."""
        sock, address = self.socket.accept()
        sock.setblocking(True)  # the handler's reads and writes block (the listener does not)
        api = self.api
        with api._cond:
            api.connections_accepted += 1
            fault = api._connection_faults.pop(0) if api._connection_faults else ""
        if fault:
            _cut(sock, fault)
            raise OSError(f"connection {fault} by the test")  # serve_forever goes on
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except BaseException:
                sock.close()
                raise
        return sock, address


class _Server6(_Server):
    address_family = socket.AF_INET6


def _cut(sock: socket.socket, how: str) -> None:
    """End a connection without an answer: RST (``reset``) or FIN (``close``; over TLS
    without close_notify)."""
    try:
        if how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


ROUTES: List[Tuple[str, "re.Pattern[str]", str]] = [
    ("GET", re.compile(r"/api/v1/pods"), "list_pods"),
    ("GET", re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods"), "list_pods"),
    ("GET", re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)"), "get_pod"),
    ("PUT", re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/status"),
     "put_pod_status"),
    ("GET", re.compile(NAD_GROUP_PATH + r"/network-attachment-definitions"), "list_nads"),
    ("GET", re.compile(NAD_GROUP_PATH + r"/namespaces/(?P<ns>[^/]+)/network-attachment-definitions"),
     "list_nads"),
    ("GET", re.compile(NAD_GROUP_PATH + r"/namespaces/(?P<ns>[^/]+)/network-attachment-definitions/"
                       r"(?P<name>[^/]+)"), "get_nad"),
    ("POST", re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/events"), "post_event"),
    ("POST", re.compile(r"/apis/events\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/events"), "post_event"),
    ("GET", re.compile(r"/version/?"), "version"),  # the client asks for /version/
    ("GET", re.compile(r"/api/v1/nodes/(?P<name>[^/]+)"), "get_node"),
    ("POST", re.compile(r"/apis/authorization\.k8s\.io/v1/selfsubjectaccessreviews"), "review"),
] + kubedra.ROUTES
RBAC_USER = "multusd"


def request_attributes(method: str, path: str,
                       query: Dict[str, str]) -> Optional[Tuple[str, str, str, str]]:
    """(verb, group, resource[/subresource], namespace) of a resource request, as kube-apiserver's
    RequestInfo resolves it; None for non-resource paths (/version)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    named = len(rest) >= 2
    verb = {"GET": "get" if named else ("watch" if _is_watch(query) else "list"),
            "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return verb, group, resource, namespace


class _Handler(kubedra.DraRoutes, BaseHTTPRequestHandler):
    """One connection; routes each request to a ``do_route_*`` method."""

    protocol_version = "HTTP/1.1"
    server: _Server

    # ---- plumbing ----------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.wfile = kubeclients.CountingWriter(self.wfile, self.server.api.clients)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.api._cond:
            self.server.api._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.api._cond:
            self.server.api._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # tests read api.requests instead of a stderr log

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        api = self.server.api
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        body = self._read_body()
        generation = self.server.generation  # the run that accepted this connection
        with api._cond:
            if generation != api._generation or not api._running:
                # accepted as the server went away: a crashed server answers nothing
                self.close_connection = True
                return
            api.requests.append((self.command, parts.path, query))
            self.trickling = api._take_trickle(self.command, parts.path, query)
        try:
            with api._cond:
                api._cond.wait_for(lambda: not api._blackholed or api._generation != generation)
            peer = self.connection.getpeercert() if api.tls else None
            self.user = api.auth.user_of(self.headers.get("Authorization", ""), peer)
            self.wfile.client = api.clients.record(  # type: ignore[attr-defined]
                self.user or f"anonymous {self.headers.get('User-Agent', '')}", self.command,
                parts.path, query, lambda path: kubeclients.stored_objects(api, path))
            if self.user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            with api._cond:
                injected = api._take_failure(self.command, parts.path, query)
            if injected is not None and injected["drop"] and injected["processed"]:
                self.answer_lost = injected["drop"]  # carried out below, answered by a cut
            elif injected is not None and injected["drop"]:
                self.close_connection = True
                _cut(self.connection, injected["drop"])  # the request was read: no answer
                return
            if injected is not None and not injected["drop"]:
                code, retry_after = injected["status"], injected["retry_after"]
                reason = HTTPStatus(code).phrase.replace(" ", "")
                details = {"retryAfterSeconds": retry_after} if isinstance(
                    retry_after, int) else None
                raise ApiError(code, reason, f"injected failure {code} for {parts.path}", details,
                               {} if retry_after is None else {"Retry-After": str(retry_after)})
            attributes = request_attributes(self.command, parts.path, query)
            if attributes is not None and not api.allowed(*attributes[:3]):
                verb, group, resource, namespace = attributes
                where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
                raise ApiError(403, "Forbidden", f'{resource.split("/")[0]} is forbidden: User '
                               f'"{self.user}" cannot {verb} resource "{resource}" in API group '
                               f'"{group}"{where}')
            if not api.nad_crd_installed and parts.path.startswith(NAD_GROUP_PATH):
                raise ApiError(404, "NotFound", "the server could not find the requested "
                               "resource", {})
            handler, params = self._route(parts.path)
            getattr(self, "do_route_" + handler)(query=query, body=body, generation=generation,
                                                 **params)
        except ApiError as err:
            self._send_json(err.status["code"], err.status, err.headers)

    def _route(self, path: str) -> Tuple[str, Dict[str, str]]:
        path_matched = False
        for method, pattern, handler in ROUTES:
            match = pattern.fullmatch(path)
            if match:
                path_matched = True
                if method == self.command:
                    return handler, match.groupdict()
        if path_matched:
            raise ApiError(405, "MethodNotAllowed", f"{self.command} is not supported on {path}")
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _read_body(self) -> Optional[Obj]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        if kubeproto.is_protobuf(self.headers.get("Content-Type")):  # client-go's protobuf
            try:
                return kubeproto.decode(raw)
            except kubeproto.DecodeError:
                return {"__invalid__": raw.hex()}
        try:
            return json.loads(raw)
        except ValueError:
            return {"__invalid__": raw.decode("utf-8", "replace")}

    def _send_json(self, code: int, obj: Obj, headers: Optional[Dict[str, str]] = None) -> None:
        if getattr(self, "answer_lost", ""):  # fail_next(..., processed=True)
            self.close_connection = True
            _cut(self.connection, self.answer_lost)
            return
        body = json.dumps(obj).encode()
        headers = dict(headers or {})
        # kube-apiserver sends Retry-After with every Status that carries retryAfterSeconds
        retry_after = (obj.get("details") or {}).get("retryAfterSeconds") \
            if obj.get("kind") == "Status" else None
        if retry_after and "Retry-After" not in headers:
            headers["Retry-After"] = str(retry_after)
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        head = (f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Cache-Control: no-cache, private\r\n{extra}\r\n").encode()
        if getattr(self, "trickling", None):
            self._trickle(head + body, self.trickling)
            return
        self.wfile.write(head + body)  # one write: see the module docstring

    def _trickle(self, answer: bytes, trickle: Dict[str, Any]) -> None:
        """Send ``answer`` as :meth:`FakeKubeAPI.trickle` says: late, then byte by byte."""
        api = self.server.api
        generation = self.server.generation
        path = urlsplit(self.path).path

        def stopped() -> bool:
            return api._trickle_epoch != trickle["epoch"] or api._generation != generation \
                or not api._running

        with api._cond:
            api.trickles_begun += 1
            api._cond.notify_all()
        line_end = answer.index(b"\r\n") + 2  # the status line late, then byte by byte
        pieces = [answer[:line_end]] + [answer[i:i + 1] for i in range(line_end, len(answer))]
        outcome = "whole"
        try:
            for number, piece in enumerate(pieces):
                with api._cond:
                    if api._cond.wait_for(stopped, trickle["head_after"] if number == 0
                                          else trickle["interval"]):
                        outcome = "stopped"
                        break
                self.wfile.write(piece)
        except OSError:
            outcome = "client gone"
        if outcome != "whole":
            self.close_connection = True
        with api._cond:
            api.trickled.append((path, outcome))
            api._cond.notify_all()

    # ---- lists and watches ---------------------------------------------------------------------

    def do_route_list_pods(self, query: Dict[str, str], generation: int, ns: str = "",
                           **_: Any) -> None:
        self._list_or_watch("pods", self.server.api._pods, "PodList", "v1", query, ns, generation)

    def do_route_list_nads(self, query: Dict[str, str], generation: int, ns: str = "",
                           **_: Any) -> None:
        self._list_or_watch("nads", self.server.api._nads, "NetworkAttachmentDefinitionList",
                            "k8s.cni.cncf.io/v1", query, ns, generation)

    def _list_or_watch(self, kind: str, store: Dict[Key, Obj], list_kind: str, api_version: str,
                       query: Dict[str, str], ns: str, generation: int) -> None:
        selector = _FieldSelector(query.get("fieldSelector", ""))
        selects = bool(selector.terms or query.get("labelSelector"))
        if ns:
            selector.terms.append((_FieldSelector.FIELDS["metadata.namespace"], ns, True))
        api = self.server.api
        with api._cond:
            api.read_log.append((time.monotonic(), kind, _is_watch(query) and  # a WatchList:
                                 query.get("sendInitialEvents", "").lower() != "true"))  # a read
        if _is_watch(query):
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

    def _watch(self, kind: str, store: Dict[Key, Obj], selector: _FieldSelector,
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
            if not api.watch_cache_ready:
                raise ApiError(429, "TooManyRequests", "storage is (re)initializing",
                               {"retryAfterSeconds": 1})
        if api.expired_as_http and not stream_list and requested not in ("", "0") and \
                int(requested) < compacted:
            raise ApiError(410, "Gone", f"too old resource version: {requested} ({compacted})")
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
            told = sent  # the newest version this watcher was told (an event or a bookmark)
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

    def _send_change(self, etype: str, old: Optional[Obj], new: Optional[Obj],
                     selector: _FieldSelector) -> bool:
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
        line = json.dumps({"type": etype, "object": obj}).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))

    # ---- single objects ------------------------------------------------------------------------

    def do_route_get_pod(self, ns: str, name: str, **_: Any) -> None:
        self._send_json(200, self._get("pods", self.server.api._pods, ns, name))

    def do_route_get_nad(self, ns: str, name: str, **_: Any) -> None:
        obj = self._get("network-attachment-definitions.k8s.cni.cncf.io", self.server.api._nads,
                        ns, name)
        self._send_json(200, obj)

    def _get(self, resource: str, store: Dict[Key, Obj], ns: str, name: str) -> Obj:
        with self.server.api._cond:
            obj = store.get((ns, name))
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def do_route_put_pod_status(self, ns: str, name: str, body: Optional[Obj], **_: Any) -> None:
        api = self.server.api
        if not isinstance(body, dict) or "__invalid__" in body or "metadata" not in body:
            raise ApiError(400, "BadRequest", "the body of a pods/status update must be a Pod")
        meta = body["metadata"]
        if meta.get("name", name) != name or meta.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the name or namespace of the body does not match "
                                              "the request URL")
        with api._cond:
            old = api._pods.get((ns, name))
            if old is None:
                raise not_found("pods", name)
            uid = meta.get("uid")
            if uid and uid != old["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on pods \"{name}\": "
                               f"Precondition failed: UID in precondition: {uid}, UID in object "
                               f"meta: {old['metadata']['uid']}")
            refusal = node_restriction(self.user, name, old, body)  # admission: before the rv
            if refusal:
                raise ApiError(403, "Forbidden", refusal)
            rv = meta.get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": '
                               "the object has been modified; please apply your changes to the "
                               "latest version and try again")
            new = self._status_update(old, body)
            if new != old:
                new = api._store_update("pods", api._pods, old, new)
            result = copy.deepcopy(new)
        self._send_json(200, result)

    @staticmethod
    def _status_update(old: Obj, body: Obj) -> Obj:
        """kube-apiserver's pod status strategy: the body wins except for these fields."""
        new = copy.deepcopy(body)
        new["apiVersion"], new["kind"] = "v1", "Pod"
        new["spec"] = copy.deepcopy(old["spec"])
        meta = new["metadata"]
        for kept in ("name", "namespace", "uid", "creationTimestamp", "ownerReferences",
                     "resourceVersion", "managedFields"):
            if kept in old["metadata"]:
                meta[kept] = copy.deepcopy(old["metadata"][kept])
        meta.pop("deletionTimestamp", None)
        meta.setdefault("annotations", {})
        if "status" not in new:
            new["status"] = {}
        return new

    def do_route_post_event(self, ns: str, body: Optional[Obj], **_: Any) -> None:
        api = self.server.api
        if not isinstance(body, dict) or "__invalid__" in body:
            raise ApiError(400, "BadRequest", "the body of an event must be JSON")
        event = copy.deepcopy(body)
        meta = event.setdefault("metadata", {})
        involved = event.get("involvedObject") or event.get("regarding") or {}
        if meta.get("namespace", ns) != ns or involved.get("namespace", ns) != ns:
            raise ApiError(422, "Invalid", "event namespace must match the involved object's")
        if not meta.get("name") and not meta.get("generateName"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        with api._cond:
            meta.setdefault("name", meta.get("generateName", "") + uuid.uuid4().hex[:5])
            meta.update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion=api._bump(),
                        creationTimestamp=_now())
            api.events.append(event)
            api._cond.notify_all()
        self._send_json(201, event)

    def do_route_get_node(self, name: str, **_: Any) -> None:
        with self.server.api._cond:
            exists = name in self.server.api._nodes
        if not exists:
            raise not_found("nodes", name)
        uid = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
        self._send_json(200, {"apiVersion": "v1", "kind": "Node",
                              "metadata": {"name": name, "uid": uid},
                              "status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    def do_route_review(self, body: Optional[Obj], **_: Any) -> None:
        """A SelfSubjectAccessReview, answered from :meth:`FakeKubeAPI.deny`'s list."""
        attributes = ((body or {}).get("spec") or {}).get("resourceAttributes")
        if not isinstance(attributes, dict) or not attributes.get("verb"):
            raise ApiError(400, "BadRequest", "spec.resourceAttributes.verb: Required value")
        resource = attributes.get("resource", "")
        if attributes.get("subresource"):
            resource += "/" + attributes["subresource"]
        allowed = self.server.api.allowed(attributes["verb"], attributes.get("group", ""), resource)
        review = copy.deepcopy(body)
        review["status"] = {"allowed": allowed}
        if not allowed:
            review["status"]["reason"] = "denied by the fake API server's deny() list"
        else:
            review["status"]["reason"] = "RBAC: allowed by the fake API server"
        self._send_json(201, review)

    def do_route_version(self, **_: Any) -> None:
        self._send_json(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-multusd-fake",
                              "platform": "linux/amd64"})


@pytest.fixture
def make_kube_api(tmp_path) -> Iterator[Callable[..., FakeKubeAPI]]:
    """Factory of started fake API servers (keyword options as :class:`FakeKubeAPI`).

    Every server it made is stopped at teardown.
    """
    made: List[FakeKubeAPI] = []

    def make(**options: Any) -> FakeKubeAPI:
        workdir = tmp_path / f"kubeapi{len(made)}"
        workdir.mkdir()
        api = FakeKubeAPI(str(workdir), **options).start()
        made.append(api)
        return api

    yield make
    for api in made:
        api.stop()


@pytest.fixture
def kube_api(make_kube_api) -> FakeKubeAPI:
    """One started fake API server on plain HTTP with the default token and node."""
    return make_kube_api()
