"""multusd.kube.credentials: token files re-read, certificate rotation, a bounded redaction set."""

from __future__ import annotations

import logging
import os

import pytest

from multusd.kube.credentials import REDACTED, Credentials, Secrets
from multusd.kube.kubeconfig import KubeconfigError, Settings

TOKEN = "tok-0a1b2c3d4e5f6789"


def replace(path, text: str) -> None:
    """Replace a file as the kubelet does: a new file renamed over the old one."""
    with open(f"{path}.new", "w") as handle:
        handle.write(text)
    os.rename(f"{path}.new", path)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    replace(path, TOKEN + "\n")
    return path


def test_a_replaced_token_file_is_read_before_the_next_request(token_file):
    credentials = Credentials(Settings(host="https://x", token_file=str(token_file)), Secrets())
    assert credentials.header() == f"Bearer {TOKEN}"
    assert credentials.header() == f"Bearer {TOKEN}" and credentials.rotations == 0
    replace(token_file, "tok-new-99887766\n")
    assert credentials.header() == "Bearer tok-new-99887766"
    assert credentials.rotations == 1 and credentials.rotates


def test_a_token_file_gone_mid_rotation_keeps_the_token_read_before(token_file, caplog):
    credentials = Credentials(Settings(host="https://x", token_file=str(token_file)), Secrets())
    os.unlink(token_file)
    with caplog.at_level(logging.WARNING, logger="multusd.kube.credentials"):
        assert credentials.header() == f"Bearer {TOKEN}"
        assert credentials.refresh() is False
    assert "cannot re-read the token file" in caplog.text and TOKEN not in caplog.text


def test_a_token_file_missing_at_start_is_a_kubeconfig_error(tmp_path):
    with pytest.raises(KubeconfigError) as caught:
        Credentials(Settings(host="https://x", token_file=str(tmp_path / "none")), Secrets())
    assert "tokenFile" in str(caught.value)


def test_refresh_says_whether_a_credential_changed(token_file):
    credentials = Credentials(Settings(host="https://x", token_file=str(token_file)), Secrets())
    assert credentials.refresh() is False
    replace(token_file, "tok-new-11223344\n")
    assert credentials.refresh() is True
    assert credentials.header() == "Bearer tok-new-11223344"


def test_a_replaced_client_certificate_raises_the_generation_once(tmp_path):
    for name in ("a.pem", "b.pem"):
        (tmp_path / name).write_text(f"-----{name}-----\n")
    current = tmp_path / "kubelet-client-current.pem"
    os.symlink("a.pem", current)
    settings = Settings(host="https://x", cert_file=str(current), key_file=str(current))
    credentials = Credentials(settings, Secrets())
    assert credentials.header() is None and credentials.tls_generation == 0
    os.symlink("b.pem", tmp_path / "next")
    os.rename(tmp_path / "next", current)  # the kubelet's rotation: the symlink replaced
    credentials.header()
    credentials.header()
    assert credentials.tls_generation == 1 and credentials.rotations == 1


def test_a_certificate_half_replaced_waits_for_both_files(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("cert")
    key.write_text("key")
    credentials = Credentials(Settings(host="https://x", cert_file=str(cert),
                                       key_file=str(key)), Secrets())
    os.unlink(key)
    replace(cert, "new cert")
    credentials.header()
    assert credentials.tls_generation == 0  # the key is not there yet
    key.write_text("new key")
    credentials.header()
    assert credentials.tls_generation == 1


def test_the_redaction_set_holds_the_live_tokens_only(token_file):
    secrets = Secrets()
    credentials = Credentials(Settings(host="https://x", token_file=str(token_file)), secrets)
    tokens = [TOKEN] + [f"tok-rotated-{n:08d}" for n in range(1, 50)]
    for token in tokens[1:]:
        replace(token_file, token + "\n")
        credentials.header()
    assert credentials.rotations == 49
    assert len(secrets) == 4  # the current and the replaced token, each bare and as a header
    text = " ".join(tokens[:3] + tokens[-2:])
    redacted = secrets.redact(text)
    assert tokens[-1] not in redacted and tokens[-2] not in redacted  # current, and replaced
    assert tokens[0] in redacted and tokens[2] in redacted  # long gone: not matched any more
    assert redacted.count(REDACTED) == 2
    assert secrets.redact(f"Authorization: Bearer {tokens[-1]}") == f"Authorization: {REDACTED}"


def test_a_password_is_redacted_beside_the_rotating_token():
    secrets = Secrets()
    Credentials(Settings(host="https://x", basic="admin:pw-31415926"), secrets)
    secrets.add("Bearer tok-one-1111", "authorization")
    secrets.add("Bearer tok-two-2222", "authorization")
    secrets.add("Bearer tok-three-3333", "authorization")
    assert secrets.redact("pw-31415926 tok-one-1111 tok-two-2222 tok-three-3333") == \
        f"{REDACTED} tok-one-1111 {REDACTED} {REDACTED}"
