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

Per client (the user its token or certificate names): requests, response bytes and whether each
LIST was a watch-cache or a storage read, in :attr:`FakeKubeAPI.clients` (tests/kubeclients.py).

Its parts: tests/kuberequests.py (what a request asks, Status answers, RBAC's refusal),
tests/kubehandler.py (the HTTP server, routes, single objects and writes), tests/kubewatch.py
(lists and watches), tests/kubecache.py (the watch cache and etcd reads, ERROR storms),
tests/kubefaults.py (failed answers, cuts, trickles, expiries, restarts), tests/kubedra.py (DRA),
tests/kubeauth.py (tokens, client certificates, NodeRestriction).

Test controls here: :meth:`add_pod`, :meth:`update_pod`, :meth:`delete_pod`, :meth:`add_nad`,
:meth:`delete_nad`, :meth:`pod`, :meth:`add_node`, :meth:`delete_node`, :attr:`events`,
:attr:`requests`, :meth:`count`, :meth:`wait_for_watchers`, :meth:`stop`/:meth:`start` (same
port; stopped, connections are refused), :attr:`connections_accepted`, :meth:`compact`,
:meth:`deny`, :meth:`rotate_token`, :meth:`rotate_client_cert` and :attr:`kubeconfig_path`;
``host="::1"`` listens on IPv6 (the TLS certificate names 127.0.0.1, ::1 and localhost). The
faults are tests/kubefaults.py's (:meth:`fail_next`, :meth:`trickle`, :meth:`fail_connections`,
:meth:`expire_watches`, :meth:`fail_watches`, :attr:`expired_as_http`, :meth:`restart`,
:meth:`blackhole`), the reads tests/kubecache.py's (:meth:`hold_watch_cache`,
:attr:`watch_cache_ready`, :attr:`list_reads`, :meth:`count_list_reads`,
:attr:`bookmark_interval`, :meth:`error_storm`, :meth:`count_list_watch`).

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
import ssl
import socket
import subprocess
import threading
import uuid
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import kubecache
import kubeclients
import kubedra
import kubefaults
from kubeauth import Authenticator, ClientCertificates
from kubehandler import Handler, Server, Server6
from kuberequests import (NAD_GROUP_PATH, RBAC_USER, ApiError, Key, Obj, is_watch,  # noqa: F401
                          request_attributes, status_object, timestamp)

DEFAULT_TOKEN = "fake-kube-token-8c1d2f7e6b5a4930"
DEFAULT_NODE = "node-a"
CONFIG_SOURCE = "kubernetes.io/config.source"


class FakeKubeAPI(kubefaults.Faults, kubecache.ReadPaths, kubedra.DraStore):
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
        self._init_faults()
        self.connections_accepted = 0  # TCP connections accepted (TLS: handshakes begun)
        self._nodes: set = {node}
        self._denied: set = set()  # (verb, group, resource[/subresource])
        self._generation = 0  # bumped by stop(): watches of an earlier run end
        self._running = False
        self._watchers = 0  # watch streams open now
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


    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def listening(self) -> bool:
        """Whether it takes connections (False once :meth:`stop` closed its socket)."""
        return self._httpd is not None

    def start(self) -> "FakeKubeAPI":
        """Serve (again) on the same port; the store and its resourceVersions are kept."""
        if self._running:
            return self
        server_class = Server6 if ":" in self.host else Server
        httpd = server_class((self.host, self.port), Handler)
        httpd.api = self
        httpd.generation = self._generation
        httpd.tls = self._ssl_context  # the handshake follows accept(): see kubehandler.Server.get_request
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
                "creationTimestamp": timestamp(), "annotations": annotations,
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
                pod["metadata"].setdefault("deletionTimestamp", timestamp())
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
                             "creationTimestamp": timestamp(), "annotations": dict(annotations or {})},
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

    # ---- test controls: requests --------------------------------------------------------------

    def count(self, method: Optional[str] = None, path_prefix: str = "",
              watch: Optional[bool] = None) -> int:
        """How many requests matched (method, path prefix, watch or not)."""
        with self._cond:
            return sum(1 for m, path, query in self.requests
                       if (method is None or m == method.upper()) and path.startswith(path_prefix)
                       and (watch is None or is_watch(query) == watch))

    def wait_for_watchers(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until ``count`` watch streams are open (a test synchronisation point)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._watchers >= count, timeout)


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
