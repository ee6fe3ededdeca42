"""multusd.core.settings: the multus settings read strictly, every problem listed."""

from __future__ import annotations

import pytest

from multusd.core.settings import load_settings, require_delegates
from multusd.errors import ConfigError, InvalidNetworkConfig


def test_settings_defaults_and_global_namespaces_forms():
    settings = load_settings({"clusterNetwork": "x"})
    assert settings.conf_dir == "/etc/cni/multus/net.d"
    assert settings.multus_namespace == "kube-system"
    assert settings.system_namespaces == ("kube-system",)
    assert settings.global_namespaces == ("default",)
    assert settings.namespace_isolation is False
    assert load_settings({"clusterNetwork": "x", "globalNamespaces": " a, b"}) \
        .global_namespaces == ("a", "b")
    assert load_settings({"clusterNetwork": "x", "globalNamespaces": ["c"]}) \
        .global_namespaces == ("c",)
    assert load_settings({"clusterNetwork": "x", "systemNamespaces": None}) \
        .system_namespaces == ()


def test_settings_list_every_problem():
    with pytest.raises(ConfigError) as err:
        load_settings({"clusterNetwork": 3, "systemNamespaces": "kube-system",
                       "namespaceIsolation": "yes"})
    paths = [p.path for p in err.value.problems]
    assert paths == ["systemNamespaces", "namespaceIsolation", "clusterNetwork"]
    assert "must be a list of strings" in err.value.msg


def test_settings_need_delegates_or_cluster_network():
    with pytest.raises(ConfigError, match="at least one delegate/clusterNetwork"):
        load_settings({"name": "multus"})


def test_require_delegates_checks_presence_only_and_says_where_to_set_it():
    require_delegates({"clusterNetwork": "cbr0"})
    require_delegates({"delegates": [{"type": "bridge"}]})
    for conf in ({}, {"clusterNetwork": "", "delegates": []}, {"clusterNetwork": None}):
        with pytest.raises(InvalidNetworkConfig) as err:
            require_delegates(conf)
        assert err.value.msg.startswith("at least one delegate/clusterNetwork must be specified")
        assert "daemon-config.json or the runtime's CNI config" in err.value.msg

