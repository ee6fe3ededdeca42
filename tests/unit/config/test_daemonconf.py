"""daemon-config.json loading: every upstream key accepted, every problem reported at once."""

from __future__ import annotations

import json

import pytest

from multusd.config import daemonconf
from multusd.errors import ConfigError


def write(tmp_path, obj) -> str:
    path = tmp_path / "daemon-config.json"
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(path)


def test_upstream_thick_config_loads(tmp_path):
    upstream = {
        "chrootDir": "", "cniVersion": "0.3.1", "logLevel": "verbose", "logToStderr": True,
        "cniConfigDir": "/host/etc/cni/net.d", "multusAutoconfigDir": "/host/etc/cni/net.d",
        "multusConfigFile": "auto", "socketDir": "/host/run/multus/",
    }
    loaded = daemonconf.load(write(tmp_path, upstream))
    assert loaded.socket_path == "/host/run/multus/multus.sock"
    assert loaded.log_level == "verbose"
    assert loaded.warnings == ()


def test_every_problem_is_reported_together(tmp_path):
    bad = {"chrootDir": "/hostroot", "socketDir": "run/multus", "logLevel": "loud",
           "metricsPort": 70000, "connectionLimit": 0, "logToStderr": "yes"}
    with pytest.raises(ConfigError) as info:
        daemonconf.load(write(tmp_path, bad))
    paths = [p.path for p in info.value.problems]
    assert paths == ["chrootDir", "socketDir", "logLevel", "logToStderr", "metricsPort",
                     "connectionLimit"]
    assert "runs on the host" in info.value.msg
    assert "must be an absolute path, got 'run/multus'" in info.value.msg


def test_unknown_key_is_a_warning_not_an_error(tmp_path):
    loaded = daemonconf.load(write(tmp_path, {"socketDri": "/x"}))
    assert loaded.warnings == ("socketDri: unknown key, ignored (check its spelling)",)


def test_missing_and_invalid_files_say_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        daemonconf.load(str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="not valid JSON"):
        daemonconf.load(write(tmp_path, "{"))


def test_connection_limit_sizes_the_worker_pool(tmp_path):
    assert daemonconf.load(write(tmp_path, {"connectionLimit": 3})).workers == 3


def test_overlay_replaces_top_level_keys_whole():
    daemon = daemonconf.from_dict({"namespaceIsolation": True, "runtimeConfig": {"a": 1},
                               "readinessindicatorfile": "/x"})
    merged = daemonconf.overlay({"name": "multus", "runtimeConfig": {"b": 2},
                             "readinessindicatorfile": "/y"}, daemon)
    assert merged == {"name": "multus", "runtimeConfig": {"a": 1}, "namespaceIsolation": True}
    assert "readinessindicatorfile" in daemonconf.overlay(
        {}, daemonconf.from_dict({"multusConfigFile": "/etc/x.conf", "readinessindicatorfile": "/x"}))


def test_retry_delete_on_error_false_is_a_warning_saying_what_multusd_does():
    from multusd.config.daemonconf import from_dict

    warned = from_dict({"retryDeleteOnError": False}).warnings
    assert len(warned) == 1 and warned[0].startswith("retryDeleteOnError: false is not followed")
    assert "multusd gc --forget" in warned[0]
    assert from_dict({"retryDeleteOnError": True}).warnings == ()
    assert from_dict({}).warnings == ()


def test_delete_retry_window_is_seconds_ten_by_default():
    assert daemonconf.from_dict({}).delete_retry_window == 10.0
    assert daemonconf.from_dict({"deleteRetryWindow": 90}).delete_retry_window == 90.0
    assert daemonconf.from_dict({"deleteRetryWindow": 0.5}).delete_retry_window == 0.5
    assert daemonconf.from_dict({"deleteRetryWindow": 90}).warnings == ()  # a key of ours
    for bad in (0, -5, "5m", True):
        with pytest.raises(ConfigError) as info:
            daemonconf.from_dict({"deleteRetryWindow": bad})
        assert info.value.problems[0].path == "deleteRetryWindow"
        assert "must be a number greater than 0" in info.value.msg


def test_enable_dynamic_networks_is_an_opt_in_boolean():
    assert daemonconf.from_dict({}).enable_dynamic_networks is False
    on = daemonconf.from_dict({"enableDynamicNetworks": True, "kubeconfig": "/k"})
    assert on.enable_dynamic_networks is True and on.warnings == ()
    with pytest.raises(ConfigError, match="enableDynamicNetworks"):
        daemonconf.from_dict({"enableDynamicNetworks": "yes"})


def test_enable_dynamic_networks_without_a_kubeconfig_is_a_warning():
    loaded = daemonconf.from_dict({"enableDynamicNetworks": True})
    assert len(loaded.warnings) == 1
    assert loaded.warnings[0].startswith("enableDynamicNetworks:")
    assert "kubeconfig" in loaded.warnings[0] and "ignored" in loaded.warnings[0]


def test_keys_are_read_as_upstreams_daemon_reads_them_into_its_structs(tmp_path):
    """Go's field matching ("SocketDir" is socketDir), null leaves a setting at its default,
    the last of a key given twice wins; the overlay keeps the keys as written."""
    text = ('{"SocketDir": "/run/a/", "logLevel": "debug", "LOGLEVEL": "error", '
            '"metricsPort": 9091, "metricsPort": null, "requestTimeout": 1e2}')
    loaded = daemonconf.load(write(tmp_path, text))
    assert loaded.socket_dir == "/run/a/" and loaded.log_level == "error"
    assert loaded.metrics_port == 9091 and loaded.request_timeout == 100.0
    assert loaded.warnings == ()
    assert set(loaded.raw) == {"SocketDir", "logLevel", "LOGLEVEL", "metricsPort",
                               "requestTimeout"}


def test_log_options_are_read_as_upstreams_log_options_struct(tmp_path):
    """"MaxSize" sets maxSize (the log file's rotation), null leaves a field unset; a value Go
    refuses is a config error (it was handed to the log's set-up, which raised at start)."""
    loaded = daemonconf.load(write(tmp_path, '{"logOptions": {"MaxSize": 7, "maxBackups": 2, '
                                              '"MAXBACKUPS": null, "Compress": true}}'))
    assert loaded.log_options == {"maxSize": 7, "compress": True}
    with pytest.raises(ConfigError) as excinfo:
        daemonconf.load(write(tmp_path, '{"logOptions": {"maxSize": "big", "MaxAge": 1.5}}'))
    assert "logOptions.maxSize: must be an integer, got 'big'" in excinfo.value.msg
    assert "logOptions.maxAge: must be an integer, got 1.5" in excinfo.value.msg


@pytest.mark.parametrize("text, fragment", [
    ('{"requestTimeout": NaN}', "NaN is not JSON"),
    ('{"requestTimeout": 1e400}', "out of range"),
    ('\ufeff{}', "byte order mark"),
    ('{"x": ' + "[" * 10001 + "]" * 10001 + "}", "exceeded max depth"),
])
def test_json_upstream_refuses_is_a_config_error(tmp_path, text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        daemonconf.load(write(tmp_path, text))
