"""multusd.kube.kubeconfig: a node's kubeconfig read as ``kubernetes.config`` reads it."""

import base64
import json
import os
import stat

import pytest
from kubernetes import client, config

from multusd.kube import kubeconfig
from multusd.kube.credentials import Credentials, Secrets

TOKEN = "tok-3f9a2c1d8e7b6a5f"
CA, CERT, KEY = b"-----CA-----\n", b"-----CERT-----\n", b"-----KEY-----\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write(directory, cluster: dict, user: dict, *, name="kc") -> str:
    document = {"apiVersion": "v1", "kind": "Config", "current-context": "ctx",
                "contexts": [{"name": "other", "context": {"cluster": "x", "user": "y"}},
                             {"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}]}
    path = os.path.join(str(directory), name)
    with open(path, "w") as handle:
        json.dump(document, handle)
    return path


def content(path):
    if path is None:
        return None
    with open(path, "rb") as handle:
        return handle.read()


def fields(settings: kubeconfig.Settings, authorization) -> dict:
    """What a loader found; files by their content (paths may differ)."""
    return {"host": settings.host, "authorization": authorization, "verify": settings.verify,
            "ca": content(settings.ca_file), "cert": content(settings.cert_file),
            "key": content(settings.key_file)}


def ours(path) -> dict:
    settings = kubeconfig.load(path)
    assert settings is not None
    return fields(settings, Credentials(settings, Secrets()).header())


def theirs(path) -> dict:
    """The package's loader, read back as multusd reads a credential plugin's result."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=configuration,
                            persist_config=False)
    return fields(kubeconfig.from_configuration(configuration),
                  kubeconfig.configuration_token(configuration))


def both(path):
    return ours(path), theirs(path)


@pytest.fixture
def files(tmp_path):
    for name, data in (("ca.crt", CA), ("client.crt", CERT), ("client.key", KEY)):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "token").write_text(TOKEN + "\n")
    return tmp_path


CASES = {
    "token over http": ({"server": "http://127.0.0.1:8080/"}, {"token": TOKEN}),
    "token and CA file": ({"server": "https://api:6443", "certificate-authority": "ca.crt"},
                          {"token": TOKEN}),
    "tokenFile, relative": ({"server": "https://api:6443", "certificate-authority": "ca.crt"},
                            {"tokenFile": "token"}),
    "inline CA and client certificate": (
        {"server": "https://api:6443", "certificate-authority-data": b64(CA)},
        {"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)}),
    "kubelet style files": ({"server": "https://api:6443", "certificate-authority": "ca.crt"},
                            {"client-certificate": "client.crt", "client-key": "client.key"}),
    "data wins over file": ({"server": "https://api:6443", "certificate-authority": "gone.crt",
                             "certificate-authority-data": b64(CA)}, {"token": TOKEN}),
    "insecure": ({"server": "https://api:6443", "insecure-skip-tls-verify": True},
                 {"token": TOKEN}),
    "http ignores TLS files": ({"server": "http://api:8080", "certificate-authority": "ca.crt"},
                               {"client-certificate": "client.crt"}),
    "basic auth": ({"server": "https://api:6443"}, {"username": "admin", "password": "pässword"}),
    "empty token falls to basic": ({"server": "https://api:6443"},
                                   {"token": "", "username": "a", "password": "b"}),
    "no credentials": ({"server": "https://api:6443"}, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_configuration_as_the_package_loader(files, case):
    cluster, user = CASES[case]
    ours, theirs = both(write(files, cluster, user))
    assert ours == theirs


def test_a_kubeconfig_elsewhere_resolves_files_against_its_own_directory(files, tmp_path,
                                                                         monkeypatch):
    path = write(files, {"server": "https://api:6443", "certificate-authority": "ca.crt"},
                 {"tokenFile": "token"})
    monkeypatch.chdir("/")
    ours, theirs = both(path)
    assert ours == theirs and ours["ca"] == CA


def test_an_empty_data_value_leaves_its_file_in_force_as_client_go_does(files):
    path = write(files, {"server": "https://api:6443", "certificate-authority-data": "",
                         "certificate-authority": "ca.crt"}, {"token": TOKEN})
    assert content(kubeconfig.load(path).ca_file) == CA


def test_a_credential_plugin_is_left_to_the_package_loader(tmp_path):
    path = write(tmp_path, {"server": "https://api:6443"},
                 {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}})
    assert kubeconfig.load(path) is None


def test_inline_keys_become_one_private_file_each_reused_on_reload(tmp_path):
    path = write(tmp_path, {"server": "https://api:6443"},
                 {"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)})
    first = kubeconfig.load(path)
    listing = sorted(os.listdir(kubeconfig.data_dir()))
    second = kubeconfig.load(path)
    assert (first.cert_file, first.key_file) == (second.cert_file, second.key_file)
    assert sorted(os.listdir(kubeconfig.data_dir())) == listing  # nothing new left behind
    assert stat.S_IMODE(os.stat(first.key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(kubeconfig.data_dir()).st_mode) == 0o700


@pytest.mark.parametrize("document, words", [
    ({"clusters": []}, "'current-context'"),
    ({"current-context": "nope", "contexts": []}, "'nope' in 'contexts'"),
    ({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k"}}]},
     "'k' in 'clusters'"),
    ({"current-context": "c", "contexts": [{"name": "c"}]}, "no 'context' mapping"),
])
def test_an_unusable_kubeconfig_says_which_key(tmp_path, document, words):
    path = tmp_path / "kc"
    path.write_text(json.dumps(document))
    with pytest.raises(kubeconfig.KubeconfigError) as info:
        kubeconfig.load(str(path))
    assert words in str(info.value)


def test_errors_name_files_never_values(tmp_path):
    path = write(tmp_path, {"server": "https://api:6443", "certificate-authority": "gone.crt"},
                 {"token": TOKEN})
    with pytest.raises(kubeconfig.KubeconfigError) as info:
        kubeconfig.load(path)
    assert "gone.crt" in str(info.value) and TOKEN not in str(info.value)
    bad = write(tmp_path, {"server": "https://api:6443"},
                {"token": TOKEN, "client-key-data": TOKEN + "xy"}, name="bad")
    with pytest.raises(kubeconfig.KubeconfigError) as info:
        kubeconfig.load(bad)
    assert "'client-key-data' is not base64" in str(info.value) and TOKEN not in str(info.value)


def test_the_parsed_kubeconfig_is_kept_once_per_content_for_the_next_start(files):
    path = write(files, {"server": "https://api:6443", "certificate-authority": "ca.crt"},
                 {"tokenFile": "token"})

    def kept():
        return sorted(name for name in os.listdir(kubeconfig.data_dir())
                      if name.endswith(".json"))

    before = kept()
    first = kubeconfig.load(path)
    made = sorted(set(kept()) - set(before))
    assert len(made) == 1
    entry = os.path.join(kubeconfig.data_dir(), made[0])
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600
    with open(path) as handle:
        assert json.load(open(entry)) == json.load(handle)
    assert kubeconfig.load(path) == first and kept() == sorted(before + made)  # read back
    write(files, {"server": "https://other:6443"}, {"token": TOKEN})  # the same path, changed
    assert kubeconfig.load(path).host == "https://other:6443"
    now = sorted(set(kept()) - set(before))
    assert len(now) == 1 and now != made  # the old content's entry is gone
