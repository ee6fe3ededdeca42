"""multusconf.generate(): upstream's generator cases (pkg/server/config/*_test.go), plus ours.

Each test writes real primary configs in a temp directory and compares the exact bytes
upstream's Go generator produces (key order, omitempty, escaping).
"""

from __future__ import annotations

import json
import os

import pytest

from multusd.config import multusconf
from multusd.errors import ConfigError

PRIMARY_040 = {"cniVersion": "0.4.0", "name": "mycni-name", "type": "mycni", "ipam": {},
               "dns": {}}


@pytest.fixture
def confdir(tmp_path):
    path = tmp_path / "net.d"
    path.mkdir()
    return path


def write(path, doc):
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return str(path)


def daemon(confdir, **extra):
    conf = {"cniVersion": "0.4.0", "multusAutoconfigDir": str(confdir),
            "cniConfigDir": str(confdir)}
    conf.update(extra)
    return conf


def generated(conf):
    doc = multusconf.generate(conf)
    assert doc is not None
    return multusconf.render(doc).decode()


def problems(excinfo):
    return [p.format() for p in excinfo.value.problems]


# ---------------------------------------------------------------- upstream's cases

def test_basic_conf_primary_matches_upstream_bytes(confdir):
    primary = write(confdir / "00-mycni.conf", PRIMARY_040)
    assert generated(daemon(confdir)) == (
        '{"cniVersion":"0.4.0","name":"multus-cni-network",'
        f'"clusterNetwork":"{primary}","type":"multus-shim"}}')


@pytest.mark.parametrize("capabilities, expected", [
    ({"portMappings": True}, {"portMappings": True}),
    ({"portMappings": True, "tuning": True}, {"portMappings": True, "tuning": True}),
    ({"portMappings": True, "tuning": False}, {"portMappings": True}),
    ({"tuning": False}, None),
])
def test_conf_capabilities_keep_only_enabled(confdir, capabilities, expected):
    write(confdir / "10-a.conf", dict(PRIMARY_040, capabilities=capabilities))
    doc = multusconf.generate(daemon(confdir))
    assert doc.get("capabilities") == expected
    assert list(doc)[0] == ("capabilities" if expected else "cniVersion")


@pytest.mark.parametrize("plugins, expected", [
    ([{"type": "a", "capabilities": {"portMappings": True, "tuning": True}}],
     {"portMappings": True, "tuning": True}),
    ([{"type": "a", "capabilities": {"portMappings": True}},
      {"type": "b", "capabilities": {"tuning": True}}],
     {"portMappings": True, "tuning": True}),
    ([{"type": "a", "capabilities": {"portMappings": True}},
      {"type": "b", "capabilities": {"tuning": False}}],
     {"portMappings": True}),
])
def test_conflist_capabilities_are_the_union_of_its_plugins(confdir, plugins, expected):
    write(confdir / "10-a.conflist", {"cniVersion": "0.4.0", "name": "n", "plugins": plugins})
    assert multusconf.generate(daemon(confdir))["capabilities"] == expected


def test_capabilities_are_emitted_sorted_like_a_go_map(confdir):
    write(confdir / "10-a.conf", dict(PRIMARY_040, capabilities={"zeta": True, "alpha": True}))
    assert '"capabilities":{"alpha":true,"zeta":true}' in generated(daemon(confdir))


def test_daemon_capabilities_are_merged_with_the_primary(confdir):
    write(confdir / "10-a.conf", dict(PRIMARY_040, capabilities={"portMappings": True}))
    doc = multusconf.generate(daemon(confdir, capabilities={"bandwidth": True}))
    assert doc["capabilities"] == {"bandwidth": True, "portMappings": True}


def test_version_mismatch_has_upstreams_exact_wording(confdir):
    primary = write(confdir / "00-mycni.conf", dict(PRIMARY_040, cniVersion="0.3.1"))
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate(daemon(confdir))
    [problem] = problems(excinfo)
    assert problem.startswith(f"{primary}: failed to load the primary CNI configuration as a "
                              "multus delegate with error 'delegate cni version is 0.3.1 while "
                              "top level cni version is 0.4.0'")
    assert "forceCNIVersion" in problem  # the remedy


def test_old_multus_version_accepts_an_old_primary(confdir):
    write(confdir / "00-mycni.conf", dict(PRIMARY_040, cniVersion="0.3.1"))
    assert multusconf.generate(daemon(confdir, cniVersion="0.3.1"))["cniVersion"] == "0.3.1"


def test_primary_without_cni_version_is_refused(confdir):
    primary = write(confdir / "10-a.conf", {"name": "n", "type": "bridge"})
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate(daemon(confdir))
    assert len(problems(excinfo)) == 1
    assert "'couldn't get cni version of delegate'" in problems(excinfo)[0]
    assert problems(excinfo)[0].startswith(primary)


def test_force_cni_version_generates_without_touching_the_primary(confdir):
    primary = confdir / "10-a.conf"
    write(primary, dict(PRIMARY_040, cniVersion="0.3.1"))
    before = primary.read_bytes()
    doc = multusconf.generate(daemon(confdir, forceCNIVersion=True))
    assert doc["cniVersion"] == "0.4.0"
    assert primary.read_bytes() == before  # generate() only plans; run() rewrites
    decision = multusconf.plan(daemon(confdir, forceCNIVersion=True))
    assert json.loads(decision.primary_rewrite)["cniVersion"] == "0.4.0"
    assert "forceCNIVersion" not in doc


def test_override_network_name_uses_the_primary_name(confdir):
    primary = write(confdir / "00-mycni.conf", PRIMARY_040)
    assert generated(daemon(confdir, overrideNetworkName=True)) == (
        '{"cniVersion":"0.4.0","name":"mycni-name",'
        f'"clusterNetwork":"{primary}","type":"multus-shim"}}')


def test_override_network_name_needs_a_primary_name(confdir):
    write(confdir / "10-a.conf", {"cniVersion": "0.4.0", "type": "bridge"})
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate(daemon(confdir, overrideNetworkName=True))
    assert problems(excinfo)[0].startswith("overrideNetworkName: ")


def test_master_cni_by_name_wins_over_lexical_order(confdir):
    write(confdir / "05-first.conf", PRIMARY_040)
    chosen = write(confdir / "20-chosen.conflist", {"cniVersion": "1.0.0", "name": "c",
                                                    "plugins": [{"type": "bridge"}]})
    doc = multusconf.generate(daemon(confdir, multusMasterCNI="20-chosen.conflist"))
    assert doc["clusterNetwork"] == chosen


def test_master_cni_missing_means_waiting(confdir):
    write(confdir / "05-other.conf", PRIMARY_040)
    decision = multusconf.plan(daemon(confdir, multusMasterCNI="10-late.conf"))
    assert decision.document is None and decision.content is None
    assert "10-late.conf" in decision.waiting_for


def test_master_cni_cannot_be_our_own_file(confdir):
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate(daemon(confdir, multusMasterCNI="00-multus.conf"))
    assert problems(excinfo)[0].startswith("multusMasterCNI: ")


def test_lexically_first_conf_or_conflist_is_the_primary(confdir):
    write(confdir / "20-b.conflist", {"cniVersion": "0.4.0", "name": "b",
                                      "plugins": [{"type": "bridge"}]})
    first = write(confdir / "10-a.conf", PRIMARY_040)
    write(confdir / "00-multus.conf", '{"junk": true}')
    write(confdir / "00-multus-old.conf", PRIMARY_040)
    write(confdir / "01-ignored.json", PRIMARY_040)
    (confdir / "02-dir.conf").mkdir()
    assert multusconf.generate(daemon(confdir))["clusterNetwork"] == first


@pytest.mark.parametrize("setup", ["empty", "missing"])
def test_no_primary_means_nothing_to_write(confdir, setup):
    directory = confdir if setup == "empty" else confdir / "absent"
    conf = daemon(confdir, multusAutoconfigDir=str(directory))
    assert multusconf.generate(conf) is None
    assert str(directory) in multusconf.plan(conf).waiting_for


def test_logging_keys_follow_go_omitempty(confdir):
    write(confdir / "10-a.conf", PRIMARY_040)
    quiet = multusconf.generate(daemon(confdir, logToStderr=False, logFile="", logLevel=""))
    assert not {"logToStderr", "logFile", "logLevel", "logOptions"} & set(quiet)
    loud = multusconf.generate(daemon(confdir, logToStderr=True, logFile="/var/log/m.log",
                                   logLevel="debug",
                                   logOptions={"maxAge": 0, "compress": True, "other": 1}))
    assert loud["logToStderr"] is True
    assert loud["logOptions"] == {"maxAge": 0, "compress": True}  # a 0 pointer is not nil
    empty = multusconf.generate(daemon(confdir, logOptions={}))
    assert empty["logOptions"] == {}
    # upstream's LogOptions struct: "MaxAge" is a maxAge, null leaves a field nil
    folded = multusconf.generate(daemon(confdir, logOptions={"MaxAge": 3, "COMPRESS": True,
                                                             "maxSize": None}))
    assert folded["logOptions"] == {"maxAge": 3, "compress": True}


def test_every_key_in_upstreams_order(confdir):
    primary = write(confdir / "10-a.conf", dict(PRIMARY_040, capabilities={"ips": True}))
    conf = daemon(confdir, binDir="/opt/cni/bin", logFile="/l", logLevel="verbose",
                  logToStderr=True,
                  logOptions={"compress": False, "maxBackups": 2, "maxSize": 3, "maxAge": 1},
                  namespaceIsolation=True, globalNamespaces="default,shared",
                  type="my-shim", cniDir="/var/lib/cni/multus", auxiliaryCNIChainName="aux",
                  daemonSocketDir="/run/multus/", socketDir="/run/multus/", chrootDir="",
                  readinessindicatorfile="", multusConfigFile="auto", clusterNetwork="x",
                  name="ignored", confDir="/etc/cni/multus/net.d")
    assert generated(conf) == (
        '{"binDir":"/opt/cni/bin","capabilities":{"ips":true},"cniVersion":"0.4.0",'
        '"logFile":"/l","logLevel":"verbose","logToStderr":true,'
        '"logOptions":{"maxAge":1,"maxSize":3,"maxBackups":2,"compress":false},'
        f'"name":"multus-cni-network","clusterNetwork":"{primary}","namespaceIsolation":true,'
        '"globalNamespaces":"default,shared","type":"my-shim","cniDir":"/var/lib/cni/multus",'
        '"auxiliaryCNIChainName":"aux","daemonSocketDir":"/run/multus/"}')


def test_namespace_isolation_false_is_omitted(confdir):
    write(confdir / "10-a.conf", PRIMARY_040)
    doc = multusconf.generate(daemon(confdir, namespaceIsolation=False, globalNamespaces=""))
    assert "namespaceIsolation" not in doc and "globalNamespaces" not in doc


def test_go_html_escaping():
    assert multusconf.render({"p": "/a<b>&c\u2028"}) == b'{"p":"/a\\u003cb\\u003e\\u0026c\\u2028"}'
    assert multusconf.render({"p": "caf\u00e9"}) == '{"p":"café"}'.encode()


# ---------------------------------------------------------------- problems and waiting

def test_auto_mode_lists_every_missing_key():
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate({"logToStderr": "yes", "capabilities": {"a": 1}})
    found = problems(excinfo)
    assert [p.split(":")[0] for p in found] == [
        "logToStderr", "capabilities.a", "multusAutoconfigDir", "cniVersion"]
    assert "the CNI version is a mandatory parameter" in found[3]
    assert "\"auto\"" in found[2]


def test_bad_top_level_version_and_log_options(confdir):
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate(daemon(confdir, cniVersion="1.0", logOptions={"maxAge": "5"},
                                globalNamespaces=["default"]))
    found = problems(excinfo)
    assert any(p.startswith("cniVersion: couldn't get top level cni version") for p in found)
    assert any(p.startswith("logOptions.maxAge: must be an integer") for p in found)
    assert any(p.startswith("globalNamespaces: must be a string") for p in found)


def test_invalid_json_primary_is_a_problem_not_an_empty_file(confdir):
    primary = write(confdir / "10-a.conf", '{"cniVersion": "0.4.0",')
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate(daemon(confdir))
    [problem] = problems(excinfo)
    assert problem.startswith(f"{primary}: the primary network config is not valid JSON")


def test_readiness_indicator_absent_means_waiting(confdir, tmp_path):
    write(confdir / "10-a.conf", PRIMARY_040)
    indicator = tmp_path / "run" / "ready"
    conf = daemon(confdir, readinessindicatorfile=str(indicator))
    assert multusconf.generate(conf) is None
    assert str(indicator) in multusconf.plan(conf).waiting_for
    indicator.parent.mkdir()
    indicator.write_text("")
    doc = multusconf.generate(conf)
    assert "readinessindicatorfile" not in doc and doc["type"] == "multus-shim"


def test_static_mode_returns_the_operator_file(tmp_path, confdir):
    static = write(tmp_path / "my-multus.conf", {"cniVersion": "1.0.0", "name": "m",
                                                 "type": "multus-shim", "clusterNetwork": "x"})
    conf = {"multusConfigFile": static, "cniConfigDir": str(confdir)}
    assert multusconf.generate(conf)["name"] == "m"
    decision = multusconf.plan(conf)
    assert decision.target == os.path.join(str(confdir), "my-multus.conf")
    assert decision.content == (tmp_path / "my-multus.conf").read_bytes()


@pytest.mark.parametrize("value, fragment", [
    ("relative.conf", "must be \"auto\" or an absolute path"),
    ("/nonexistent/multus.conf", "does not exist"),
])
def test_static_mode_problems(value, fragment):
    with pytest.raises(ConfigError) as excinfo:
        multusconf.generate({"multusConfigFile": value})
    assert fragment in problems(excinfo)[0]


def test_looks_generated_recognises_only_generator_output(confdir):
    write(confdir / "10-a.conf", PRIMARY_040)
    ours = multusconf.render(multusconf.generate(daemon(confdir)))
    assert multusconf.looks_generated(ours)
    thin = json.dumps({"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus",
                       "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig",
                       "delegates": [PRIMARY_040]}).encode()
    assert not multusconf.looks_generated(thin)
    assert not multusconf.looks_generated(b"")
    assert not multusconf.looks_generated(b'{"name":"x","type":"multus-shim"}')
