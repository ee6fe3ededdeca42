"""The stand-in API server's HTTP side: its listening server, its routes, one connection's handler.

tests/kubeapi.py's :class:`FakeKubeAPI` starts a :class:`Server` (:class:`Server6` on IPv6);
each connection gets a :class:`Handler`, which authenticates the request, applies the faults
the test queued (tests/kubefaults.py), RBAC's refusals and the missing CRD, and routes it
(:data:`ROUTES`) to a ``do_route_*`` method: lists and watches (tests/kubewatch.py), DRA
(tests/kubedra.py), single objects, writes and reviews (here). :func:`cut` ends a connection
without an answer.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import ssl
import struct
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

import kubeclients
import kubedra
import kubeproto
from kubeauth import node_restriction
from kuberequests import (NAD_GROUP_PATH, ApiError, Obj, Key, forbidden, not_found,
                          request_attributes, timestamp)
from kubewatch import ListWatchRoutes


class Server(ThreadingHTTPServer):
    """The listening socket: a thread per connection; each accepted one cut (a fault the test
    queued) or wrapped in TLS before its handler runs."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # socketserver's 5 drops SYNs of a burst (1 s retransmits);
    # a fleet reconnects at once after a restart
    api: Any  # the FakeKubeAPI (tests/kubeapi.py)
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
            cut(sock, fault)
            raise OSError(f"connection {fault} by the test")  # serve_forever goes on
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except BaseException:
                sock.close()
                raise
        return sock, address


class Server6(Server):
    address_family = socket.AF_INET6


def cut(sock: socket.socket, how: str) -> None:
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
    ("GET", re.compile(r"/readyz"), "readyz"),
    ("GET", re.compile(r"/api/v1/nodes/(?P<name>[^/]+)"), "get_node"),
    ("POST", re.compile(r"/apis/authorization\.k8s\.io/v1/selfsubjectaccessreviews"), "review"),
] + kubedra.ROUTES


class Handler(ListWatchRoutes, kubedra.DraRoutes, BaseHTTPRequestHandler):
    """One connection; routes each request to a ``do_route_*`` method."""

    protocol_version = "HTTP/1.1"
    server: Server

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
        self.booking: Optional[kubeclients.Request] = None  # this request in the ledger
        with api._cond:
            if generation != api._generation or not api._running:
                # accepted as the server went away: a crashed server answers nothing
                self.close_connection = True
                return
            api.requests.append((self.command, parts.path, query))
            api._book_list_watch(self.command, parts.path, query)
            self.trickling = api._take_trickle(self.command, parts.path, query)
        try:
            with api._cond:
                api._cond.wait_for(lambda: not api._blackholed or api._generation != generation)
            peer = self.connection.getpeercert() if api.tls else None
            self.user = api.auth.user_of(self.headers.get("Authorization", ""), peer)
            self.booking = api.clients.record(
                self.user or f"anonymous {self.headers.get('User-Agent', '')}", self.command,
                parts.path, query, lambda path: kubeclients.stored_objects(api, path))
            self.wfile.client = self.booking.client  # type: ignore[attr-defined]
            if self.user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            with api._cond:
                injected = api._take_failure(self.command, parts.path, query)
            if injected is not None and injected["drop"] and injected["processed"]:
                self.answer_lost = injected["drop"]  # carried out below, answered by a cut
            elif injected is not None and injected["drop"]:
                self.close_connection = True
                cut(self.connection, injected["drop"])  # the request was read: no answer
                return
            if injected is not None and not injected["drop"]:
                code, retry_after = injected["status"], injected["retry_after"]
                reason = HTTPStatus(code).phrase.replace(" ", "")
                details = {"retryAfterSeconds": retry_after} if isinstance(
                    retry_after, int) else None
                raise ApiError(code, reason, f"injected failure {code} for {parts.path}", details,
                               {} if retry_after is None else {"Retry-After": str(retry_after)})
            attributes = request_attributes(self.command, parts.path, query)
            with api._cond:
                warming = api._warming()
            if attributes is not None and (warming == "authorizer" or
                                           not api.allowed(*attributes[:3])):
                raise forbidden(self.user, attributes)  # a warming authorizer says the same
            if not api.nad_crd_installed and parts.path.startswith(NAD_GROUP_PATH):
                raise ApiError(404, "NotFound", "the server could not find the requested "
                               "resource", {})
            handler, params = self._route(parts.path)
            getattr(self, "do_route_" + handler)(query=query, body=body, generation=generation,
                                                 **params)
        except ApiError as err:
            self._send_json(err.status["code"], err.status, err.headers)
        finally:
            api.clients.served(self.booking)  # cut or failed: no longer in flight either

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
            cut(self.connection, self.answer_lost)
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
        self.server.api.clients.answered(self.booking, code)
        if getattr(self, "trickling", None):
            self._trickle(head + body, self.trickling)
            return  # served (in the ledger) when the trickle ends: the dispatch's finally
        self.wfile.write(head + body)  # one write: see the module docstring
        self.server.api.clients.served(self.booking, listed=True)

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
                        creationTimestamp=timestamp())
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

    def do_route_readyz(self, **_: Any) -> None:
        """kube-apiserver's /readyz: 500 while a restart warms up (tests/kubefaults.py)."""
        with self.server.api._cond:
            warming = self.server.api._warming()
        body = (f"[-]{warming} not ready\nreadyz check failed" if warming else "ok").encode()
        code = 500 if warming else 200
        self.server.api.clients.answered(self.booking, code)
        self.wfile.write(f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nContent-Type: text/plain"
                         f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    def do_route_version(self, **_: Any) -> None:
        self._send_json(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-multusd-fake",
                              "platform": "linux/amd64"})
