"""The node name a kubeconfig's client certificate proves (subject CN=system:node:<name>).

A kubelet's kubeconfig (/etc/kubernetes/kubelet.conf, or the rotated
/var/lib/kubelet/pki/kubelet-client-current.pem it names) authenticates as
``system:node:<name>``, the node's own name as the API server knows it. Only the subject of
the first certificate is read, with a minimal DER reader from the standard library: the
daemon needs no X.509 library for one field, and never touches the private key.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import List, Optional, Tuple

NODE_USER_PREFIX = "system:node:"
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.S)
_OID_COMMON_NAME = b"\x55\x04\x03"  # 2.5.4.3
_SEQUENCE, _SET, _OID, _VERSION = 0x30, 0x31, 0x06, 0xA0


class CertificateError(ValueError):
    """The bytes are not a certificate this reader understands."""


def _tlv(der: bytes, pos: int) -> Tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at ``pos``."""
    if pos + 2 > len(der):
        raise CertificateError("truncated DER element")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if not 0 < count <= 4 or pos + count > len(der):
            raise CertificateError("bad DER length")
        length = int.from_bytes(der[pos:pos + count], "big")
        pos += count
    if pos + length > len(der):
        raise CertificateError("DER element longer than its container")
    return tag, pos, pos + length


def _children(der: bytes, start: int, end: int) -> List[Tuple[int, int, int]]:
    out = []
    while start < end:
        element = _tlv(der, start)
        out.append(element)
        start = element[2]
    return out


def subject_common_names(der: bytes) -> List[str]:
    """The CN values of a DER certificate's subject, in order.

    :raises CertificateError: not an X.509 certificate.
    """
    tag, start, end = _tlv(der, 0)
    if tag != _SEQUENCE:
        raise CertificateError("not a DER certificate")
    tag, start, end = _tlv(der, start)  # tbsCertificate
    fields = _children(der, start, end)
    if fields and fields[0][0] == _VERSION:
        fields = fields[1:]
    if len(fields) < 5 or fields[4][0] != _SEQUENCE:
        raise CertificateError("certificate without a subject")
    # serialNumber, signature, issuer, validity, subject
    names = []
    for rdn_tag, rdn_start, rdn_end in _children(der, fields[4][1], fields[4][2]):
        if rdn_tag != _SET:
            raise CertificateError("malformed subject")
        for _, attr_start, attr_end in _children(der, rdn_start, rdn_end):
            parts = _children(der, attr_start, attr_end)
            if len(parts) == 2 and parts[0][0] == _OID and \
                    der[parts[0][1]:parts[0][2]] == _OID_COMMON_NAME:
                names.append(der[parts[1][1]:parts[1][2]].decode("utf-8", "replace"))
    return names


def first_certificate(data: bytes) -> bytes:
    """The DER bytes of the first certificate in PEM ``data`` (or ``data`` itself if DER).

    :raises CertificateError: no certificate in it.
    """
    match = _PEM.search(data)
    if match is None:
        if data[:1] == bytes([_SEQUENCE]):
            return data
        raise CertificateError("no PEM certificate in it")
    try:
        return base64.b64decode(match.group(1), validate=False)
    except (binascii.Error, ValueError):
        raise CertificateError("the PEM certificate is not valid base64") from None


def node_name_from_certificate(data: bytes) -> Optional[str]:
    """The <name> of a ``CN=system:node:<name>`` client certificate (PEM or DER), else None.

    :raises CertificateError: ``data`` holds no readable certificate.
    """
    for name in subject_common_names(first_certificate(data)):
        if name.startswith(NODE_USER_PREFIX) and len(name) > len(NODE_USER_PREFIX):
            return name[len(NODE_USER_PREFIX):]
    return None
