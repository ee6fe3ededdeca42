"""Who a request to the stand-in API server is: rotating tokens, kubelet client certificates.

The stand-in (tests/kubeapi.py) authenticates as kube-apiserver does, and as unkindly:

* bearer tokens, each naming a user; :meth:`Authenticator.rotate_token` replaces the token
  in its file (atomically, as the kubelet's projected-token volume does) and, unless told to
  keep it, the old token is rejected from then on (401);
* client certificates of a CA of its own (``CN=system:node:<node>``, ``O=system:nodes``),
  written as the kubelet writes them: one PEM file holding the certificate and key,
  ``kubelet-client-<n>.pem``, behind the symlink ``kubelet-client-current.pem``;
  :meth:`ClientCertificates.rotate` issues the next one, moves the symlink and revokes the
  old certificate, so a connection that still presents it gets 401 on its next request;
* NodeRestriction's rules for a node's own identity writing ``pods/status``: only pods bound
  to that node, and no change to the pod's labels (checked before the resourceVersion, so a
  stale copy whose labels differ gets 403, not 409).
"""

from __future__ import annotations

import os
import ssl
import subprocess
import threading
from typing import Any, Dict, Optional

NODE_PREFIX = "system:node:"


class Authenticator:
    """Bearer tokens -> users (thread-safe); see the module docstring."""

    def __init__(self, token: str, user: str) -> None:
        self._lock = threading.Lock()
        self._tokens: Dict[str, str] = {token: user}
        self.token = token
        self.token_files: list = []
        self.certificates: Optional[ClientCertificates] = None

    def user_of(self, authorization: str, peer_certificate: Optional[Dict[str, Any]]) -> Optional[str]:
        """The user a request authenticates as, or None (401)."""
        if peer_certificate and self.certificates is not None:
            user = self.certificates.user_of(peer_certificate)
            if user is not None:
                return user
        if authorization.startswith("Bearer "):
            with self._lock:
                return self._tokens.get(authorization[len("Bearer "):])
        return None

    def add_token(self, token: str, user: str) -> None:
        """Accept ``token`` as ``user`` too (a fleet of nodes, each with its own)."""
        with self._lock:
            self._tokens[token] = user

    def rotate_token(self, new: str, *, keep_old: bool = False, write_files: bool = True) -> str:
        """Make ``new`` the token (same user), rewrite every token file, revoke the old one."""
        with self._lock:
            user = self._tokens[self.token]
            if not keep_old:
                del self._tokens[self.token]
            self._tokens[new] = user
            self.token = new
            files = list(self.token_files) if write_files else []
        for path in files:
            write_atomically(path, new + "\n")
        return new


class ClientCertificates:
    """A client CA and the node's rotating certificate (see the module docstring)."""

    def __init__(self, directory: str, node: str) -> None:
        self.directory = directory
        self.node = node
        self.user = NODE_PREFIX + node
        os.makedirs(directory, exist_ok=True)
        self.ca_cert = os.path.join(directory, "client-ca.crt")
        self.ca_key = os.path.join(directory, "client-ca.key")
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-days", "1", "-subj", "/CN=fake-client-ca", "-keyout", self.ca_key,
                 "-out", self.ca_cert)
        self.current = os.path.join(directory, "kubelet-client-current.pem")
        self._lock = threading.Lock()
        self._serial = 0x1000
        self._valid = ""  # serial (hex) of the one certificate not revoked
        self.rotate()

    def rotate(self) -> str:
        """Issue the next certificate, point the symlink at it, revoke the one before."""
        with self._lock:
            self._serial += 1
            serial = self._serial
        key, csr, crt = (os.path.join(self.directory, f"next.{suffix}")
                         for suffix in ("key", "csr", "crt"))
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-subj", f"/O=system:nodes/CN={self.user}", "-keyout", key,
                 "-out", csr)
        _openssl("x509", "-req", "-in", csr, "-CA", self.ca_cert, "-CAkey", self.ca_key,
                 "-set_serial", str(serial), "-days", "1", "-out", crt)
        pem = os.path.join(self.directory, f"kubelet-client-{serial}.pem")
        with open(pem, "w", encoding="utf-8") as handle:
            handle.write(open(crt, encoding="utf-8").read() + open(key, encoding="utf-8").read())
        for scratch in (key, csr, crt):
            os.unlink(scratch)
        link = self.current + ".new"
        os.symlink(os.path.basename(pem), link)
        os.replace(link, self.current)  # as the kubelet's certificate manager does
        with self._lock:
            self._valid = f"{serial:X}"
        return pem

    def user_of(self, peer: Dict[str, Any]) -> Optional[str]:
        """The certificate's user when it is the current one, else None (revoked)."""
        serial = str(peer.get("serialNumber", "")).upper().lstrip("0")
        with self._lock:
            if serial != self._valid:
                return None
        for rdn in peer.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return value
        return None

    def server_context(self, context: ssl.SSLContext) -> None:
        """Make a server context ask for (and verify) client certificates of this CA."""
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(self.ca_cert)


def node_restriction(user: str, name: str, old: Dict[str, Any], new: Dict[str, Any]) -> Optional[str]:
    """Why NodeRestriction refuses ``user``'s pods/status update (None: it does not)."""
    if not user.startswith(NODE_PREFIX):
        return None
    node = user[len(NODE_PREFIX):]
    if (old.get("spec") or {}).get("nodeName") != node:
        return (f'pods "{name}" is forbidden: node "{node}" can only update pod status for '
                "pods with its own node name")
    old_labels = (old.get("metadata") or {}).get("labels") or {}
    new_labels = (new.get("metadata") or {}).get("labels") or {}
    if old_labels != new_labels:
        return f'pods "{name}" is forbidden: node "{node}" is not allowed to modify labels'
    return None


def write_atomically(path: str, text: str) -> None:
    scratch = path + ".new"
    with open(scratch, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(scratch, path)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)
