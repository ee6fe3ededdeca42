"""multusd.kube.identity: the node name in a client certificate (made by openssl)."""

from __future__ import annotations

import subprocess

import pytest

from multusd.kube.identity import (CertificateError, first_certificate, node_name_from_certificate,
                                   subject_common_names)


def certificate(tmp_path, subject: str, key: str = "rsa:2048") -> bytes:
    cert, keyfile = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", key, "-nodes", "-days", "1",
                    "-subj", subject, "-keyout", str(keyfile), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert.read_bytes()


def test_kubelet_certificate_names_the_node(tmp_path):
    pem = certificate(tmp_path, "/O=system:nodes/CN=system:node:Worker-7.example")
    assert node_name_from_certificate(pem) == "Worker-7.example"  # as written, not lowercased


def test_rotated_pem_with_key_first_and_der(tmp_path):
    pem = certificate(tmp_path, "/CN=system:node:n1/O=system:nodes")
    key = (tmp_path / "k.pem").read_bytes()
    assert node_name_from_certificate(key + pem) == "n1"  # kubelet-client-current.pem layout
    der = subprocess.run(["openssl", "x509", "-outform", "DER"], input=pem, check=True,
                         capture_output=True).stdout
    assert first_certificate(der) == der
    assert node_name_from_certificate(der) == "n1"


@pytest.mark.parametrize("subject", ["/CN=system:serviceaccount:kube-system:multus",
                                     "/CN=system:node:", "/O=system:nodes"])
def test_other_identities_name_no_node(tmp_path, subject):
    assert node_name_from_certificate(certificate(tmp_path, subject)) is None


def test_common_names_in_order(tmp_path):
    pem = certificate(tmp_path, "/CN=a/O=x/CN=b")
    assert subject_common_names(first_certificate(pem)) == ["a", "b"]


@pytest.mark.parametrize("data", [b"", b"not a certificate", b"\x30\x82\xff\xff\x00",
                                  b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----"])
def test_garbage_is_a_certificate_error(data):
    with pytest.raises(CertificateError):
        node_name_from_certificate(data)
