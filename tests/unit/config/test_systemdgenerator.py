"""The systemd generator's drop-in for multusd-config.path."""

from __future__ import annotations

import json
import os

from multusd.config import systemdgenerator


def test_defaults_need_no_dropin(tmp_path):
    config = tmp_path / "daemon-config.json"
    config.write_text(json.dumps({"multusAutoconfigDir": "/etc/cni/net.d",
                                  "cniConfigDir": "/etc/cni/net.d/"}))
    assert systemdgenerator.generate(str(tmp_path / "out"), str(config)) is False
    assert not (tmp_path / "out").exists()


def test_readiness_file_and_other_dirs_are_watched(tmp_path):
    config = tmp_path / "daemon-config.json"
    config.write_text(json.dumps({"multusAutoconfigDir": "/opt/cni/conf",
                                  "cniConfigDir": "/etc/cni/net.d",
                                  "readinessindicatorfile": "/run/flannel/subnet%.env"}))
    assert systemdgenerator.generate(str(tmp_path / "out"), str(config)) is True
    text = (tmp_path / "out" / "multusd-config.path.d" / systemdgenerator.DROPIN_NAME).read_text()
    assert text.splitlines()[2:] == ["[Path]", "PathChanged=/opt/cni/conf",
                                     "PathChanged=/run/flannel/subnet%%.env"]


def test_broken_or_missing_config_writes_nothing_and_never_fails(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert systemdgenerator.generate(str(tmp_path / "out"), str(broken)) is False
    assert systemdgenerator.generate(str(tmp_path / "out"), str(tmp_path / "missing.json")) is False
    relative = tmp_path / "relative.json"
    relative.write_text(json.dumps({"readinessindicatorfile": "relative/path", "cniConfigDir": 3}))
    assert systemdgenerator.generate(str(tmp_path / "out"), str(relative)) is False
    assert not os.path.exists(tmp_path / "out")
    assert systemdgenerator.main([]) == 0  # systemd always passes the directories; never fail boot
