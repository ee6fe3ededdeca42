"""multusd.core.effective: the one resolver of the configuration a request, or the node, is judged
by (daemon-config.json over the runtime's multus config), table by table."""

from __future__ import annotations

import json
import os

import pytest

from multusd import DEFAULT_CNI_DIR
from multusd.config import daemonconf
from multusd.core import effective
from multusd.errors import ConfigError

RUNTIME = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus-shim"}
DEVINFO, KUBELET = "/var/run/k8s.cni.cncf.io/devinfo", "/var/lib/kubelet"


def daemon(tmp_path, **raw):
    return daemonconf.from_dict(raw, str(tmp_path / "daemon-config.json"))


# (what, the runtime's conf, daemon-config.json,
#  expected cniDir, deviceInfoDir, kubeletRootDir, auxiliary chain, clusterNetwork or None)
REQUESTS = [
    ("the defaults", {}, {"clusterNetwork": "cn"},
     DEFAULT_CNI_DIR, DEVINFO, KUBELET, "", "cn"),
    ("the runtime's cniDir when daemon-config.json names none", {"cniDir": "/rt"},
     {"clusterNetwork": "cn"}, "/rt", DEVINFO, KUBELET, "", "cn"),
    ("daemon-config.json's keys win", {"cniDir": "/rt", "clusterNetwork": "rt-cn",
                                       "auxiliaryCNIChainName": "rt-aux"},
     {"cniDir": "/d", "clusterNetwork": "d-cn", "auxiliaryCNIChainName": "aux",
      "deviceInfoDir": "/dev-info", "kubeletRootDir": "/kl"},
     "/d", "/dev-info", "/kl", "aux", "d-cn"),
    ("auto mode: clusterNetwork only in the generated conf",
     {"clusterNetwork": "/etc/cni/net.d/10-primary.conf"}, {"defaultNetworks": ["storage"]},
     DEFAULT_CNI_DIR, DEVINFO, KUBELET, "", "/etc/cni/net.d/10-primary.conf"),
    ("settings that do not load leave the directories", {"cniDir": "/rt", "delegates": "x"},
     {"deviceInfoDir": "/di"}, "/rt", "/di", KUBELET, "", None),
    ("a relative cniDir is taken from /", {"cniDir": "var/c"}, {"clusterNetwork": "cn"},
     "/var/c", DEVINFO, KUBELET, "", "cn"),
]


@pytest.mark.parametrize("runtime, raw, cni_dir, devinfo, kubelet, aux, cluster",
                         [case[1:] for case in REQUESTS], ids=[case[0] for case in REQUESTS])
def test_a_requests_configuration(tmp_path, runtime, raw, cni_dir, devinfo, kubelet, aux,
                                  cluster):
    resolved = effective.for_request(dict(RUNTIME, **runtime), daemon(tmp_path, **raw))
    assert (resolved.cni_dir, resolved.devinfo_dir, resolved.kubelet_dir,
            resolved.auxiliary_chain) == (cni_dir, devinfo, kubelet, aux)
    assert resolved.source == effective.FROM_REQUEST
    if cluster is None:
        assert resolved.settings is None and resolved.problems
        with pytest.raises(ConfigError, match="of the multus network config"):
            resolved.require_settings()
    else:
        assert resolved.require_settings().cluster_network == cluster
        assert resolved.problems == () and resolved.why_no_settings == ""


def test_a_requests_merged_config_is_daemon_config_over_the_runtimes(tmp_path):
    conf = dict(RUNTIME, runtimeConfig={"a": 1}, readinessindicatorfile="/r", cniDir="/rt")
    resolved = effective.for_request(conf, daemon(tmp_path, clusterNetwork="cn",
                                                  runtimeConfig={"b": 2}))
    assert resolved.merged["runtimeConfig"] == {"b": 2}  # nested values replaced whole
    assert "readinessindicatorfile" not in resolved.merged  # auto mode drops it (F28)
    assert conf["runtimeConfig"] == {"a": 1}  # the caller's copy untouched


def write(path, doc) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(doc if isinstance(doc, str) else json.dumps(doc))
    return path


# (what, daemon-config.json (CONF: the cniConfigDir, STATIC: the operator's file),
#  files to write {name: doc}, expected source file name or "", cniDir, clusterNetwork or
#  None, note contains, every cniDir the node names)
NODES = [
    ("auto mode: the generated 00-multus.conf",
     {"defaultNetworks": ["storage"], "namespaceIsolation": True},
     {"CONF/00-multus.conf": dict(RUNTIME, clusterNetwork="/p/10-a.conf")},
     "CONF/00-multus.conf", DEFAULT_CNI_DIR, "/p/10-a.conf", "", (DEFAULT_CNI_DIR,)),
    ("auto mode before the file is written: the daemon's alone, and why", {}, {},
     "", DEFAULT_CNI_DIR, None, "does not exist (yet)", (DEFAULT_CNI_DIR,)),
    ("auto mode: daemon-config.json's cniDir", {"cniDir": "/d"},
     {"CONF/00-multus.conf": dict(RUNTIME, clusterNetwork="cn", cniDir="/d")},
     "CONF/00-multus.conf", "/d", "cn", "", ("/d", DEFAULT_CNI_DIR)),
    ("static mode: the copy the runtime reads, its cniDir", {"multusConfigFile": "STATIC"},
     {"CONF/static.conf": dict(RUNTIME, clusterNetwork="cn", cniDir="/copy"),
      "STATIC": dict(RUNTIME, clusterNetwork="cn", cniDir="/source")},
     "CONF/static.conf", "/copy", "cn", "", ("/copy", DEFAULT_CNI_DIR, "/source")),
    ("static mode before the copy: the operator's file", {"multusConfigFile": "STATIC"},
     {"STATIC": dict(RUNTIME, clusterNetwork="cn", cniDir="/source")},
     "STATIC", "/source", "cn", "", ("/source", DEFAULT_CNI_DIR)),
    ("static mode: daemon-config.json's cniDir over the file's",
     {"multusConfigFile": "STATIC", "cniDir": "/d"},
     {"CONF/static.conf": dict(RUNTIME, delegates=[{"type": "x"}], cniDir="/copy")},
     "CONF/static.conf", "/d", "", "", ("/d", "/copy", DEFAULT_CNI_DIR)),
    ("a runtime conf that is not JSON: said, the daemon's alone", {"cniDir": "/d"},
     {"CONF/00-multus.conf": "{not json"}, "", "/d", None, "is not valid JSON",
     ("/d", DEFAULT_CNI_DIR)),
]


@pytest.mark.parametrize("raw, files, source, cni_dir, cluster, note, dirs",
                         [case[1:] for case in NODES], ids=[case[0] for case in NODES])
def test_the_nodes_configuration(tmp_path, raw, files, source, cni_dir, cluster, note, dirs):
    names = {"CONF": str(tmp_path / "net.d"), "STATIC": str(tmp_path / "ops" / "static.conf")}

    def real(name: str) -> str:
        for key, value in names.items():
            name = name.replace(key, value)
        return name

    config = daemon(tmp_path, cniConfigDir=names["CONF"],
                    **{k: real(v) if isinstance(v, str) else v for k, v in raw.items()})
    for name, doc in files.items():
        write(real(name), doc)

    node = effective.for_node(config)

    assert node.source == (real(source) if source else "")
    assert node.cni_dir == cni_dir
    if cluster is None:
        assert node.settings is None
        assert note in node.why_no_settings
    else:
        assert node.require_settings().cluster_network == cluster
    assert all(note in n for n in node.notes) if note else node.notes == ()
    assert effective.node_cni_dirs(config) == dirs
    if "namespaceIsolation" in raw:  # daemon-config.json's keys over the file's
        assert node.settings.namespace_isolation is True
        assert node.settings.default_networks == ("storage",)


def test_the_node_configuration_is_kept_until_the_runtime_conf_changes_on_disk(tmp_path):
    conf_dir = tmp_path / "net.d"
    config = daemon(tmp_path, cniConfigDir=str(conf_dir))
    node = effective.NodeConfig(config)
    first = node.current()
    assert first.settings is None and node.current() is first

    path = write(str(conf_dir / "00-multus.conf"), dict(RUNTIME, clusterNetwork="cn"))
    second = node.current()
    assert second.require_settings().cluster_network == "cn" and second.source == path
    assert node.current() is second
    assert node.cni_dirs() == (DEFAULT_CNI_DIR,) and node.cni_dirs() is node.cni_dirs()
    write(path, dict(RUNTIME, clusterNetwork="other-network", cniDir="/rt"))
    assert node.current().require_settings().cluster_network == "other-network"
    assert node.cni_dirs() == ("/rt", DEFAULT_CNI_DIR)  # every cniDir it names, as it is now
    with open(path, "rb") as handle:
        assert effective.read_runtime_conf(config).data == handle.read()


def test_the_logged_description_names_networks_never_config_bodies(tmp_path):
    secret = {"type": "x", "name": "inline", "password": "hunter2"}
    resolved = effective.for_request(dict(RUNTIME, delegates=[secret]), daemon(tmp_path))
    shown = json.dumps(resolved.describe())
    assert "hunter2" not in shown and '"delegates": ["inline"]' in shown
    broken = effective.for_request(dict(RUNTIME), daemon(tmp_path))
    assert "do not load" in broken.describe()["settings"]
