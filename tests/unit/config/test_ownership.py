"""multusd.config.ownership: when a file counts as the one multusd wrote, and a record that
cannot be kept never fails the write it records.

Real files in a private state directory (``STATE_DIRECTORY``, as systemd sets it). What
generate-config does with the answers (write, adopt, remove only its own) is
tests/integration/test_generateconfig.py's.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from multusd import store
from multusd.config import generateconfig, ownership


@pytest.fixture
def state(tmp_path, monkeypatch) -> str:
    directory = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", f"{directory}:{tmp_path / 'second'}")
    return str(directory)


@pytest.fixture
def written(tmp_path) -> str:
    path = str(tmp_path / "net.d" / "00-multus.conf")
    store.atomic_write(path, b'{"name":"multus-cni-network"}', mode=0o600)
    return path


def test_the_record_is_in_the_first_state_directory(state, written):
    ownership.remember(written)
    assert ownership.record_path() == os.path.join(state, "written.json")
    with open(ownership.record_path()) as handle:
        record = json.load(handle)
    assert set(record) == {written} and set(record[written]) == {"sha256", "size", "ino",
                                                                 "mtime_ns"}
    assert oct(os.stat(ownership.record_path()).st_mode & 0o777) == "0o600"


def test_a_file_is_ours_while_bytes_inode_and_mtime_are_as_written(state, written):
    ownership.remember(written)
    assert ownership.is_ours(written) and ownership.is_recorded(written)
    content = open(written, "rb").read()
    store.atomic_write(written, content, mode=0o600)  # same bytes, a new inode and mtime
    assert not ownership.is_ours(written) and ownership.is_recorded(written)


def test_same_bytes_written_in_place_later_are_someone_elses(state, written):
    ownership.remember(written)
    info = os.stat(written)
    with open(written, "r+b") as handle:  # what upstream's daemon does: os.WriteFile
        handle.write(open(written, "rb").read())
    os.utime(written, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))
    assert os.stat(written).st_ino == info.st_ino
    assert not ownership.is_ours(written)


def test_other_bytes_are_not_ours(state, written):
    ownership.remember(written)
    with open(written, "ab") as handle:
        handle.write(b" ")
    assert not ownership.is_ours(written)


def test_forget_drops_the_record_and_a_missing_file_is_never_recorded(state, written, tmp_path):
    ownership.remember(written)
    ownership.forget(written)
    assert not ownership.is_recorded(written) and not ownership.is_ours(written)
    ownership.remember(str(tmp_path / "absent"))
    assert not ownership.is_recorded(str(tmp_path / "absent"))


def test_a_relative_path_is_recorded_as_its_absolute_one(state, written, monkeypatch):
    monkeypatch.chdir(os.path.dirname(written))
    ownership.remember("00-multus.conf")
    assert ownership.is_ours(written)


@pytest.fixture
def unwritable_state(tmp_path, monkeypatch) -> str:
    """A state directory that cannot be made (a file is in its place: root ignores modes)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("STATE_DIRECTORY", str(blocker))
    return str(blocker)


def test_a_record_that_cannot_be_written_is_logged_not_raised(unwritable_state, written,
                                                             caplog):
    with caplog.at_level(logging.WARNING, logger="multusd.config.ownership"):
        ownership.remember(written)
    assert f"cannot record that multusd wrote {written} in {unwritable_state}" in caplog.text
    assert "package removal will leave it in place" in caplog.text
    assert not ownership.is_recorded(written)


def test_generate_config_succeeds_when_its_record_cannot_be_kept(unwritable_state, tmp_path,
                                                                 capsys):
    net_d = tmp_path / "generated.d"
    net_d.mkdir()
    (net_d / "10-primary.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "primary", "plugins": [{"type": "bridge"}]}))
    config = tmp_path / "daemon-config.json"
    config.write_text(json.dumps({"cniVersion": "1.0.0", "cniConfigDir": str(net_d),
                                  "multusAutoconfigDir": str(net_d)}))
    assert generateconfig.run(str(config)) == 0
    assert "nothing was changed" not in capsys.readouterr().err
    assert (net_d / "00-multus.conf").read_bytes().startswith(b"{")


def test_a_corrupt_record_is_ignored_and_the_next_write_replaces_it(state, written, caplog):
    os.makedirs(state)
    with open(os.path.join(state, "written.json"), "w") as handle:
        handle.write("{not json")
    with caplog.at_level(logging.WARNING):
        assert not ownership.is_recorded(written)
    assert "ignoring corrupt multusd's record of the files it wrote" in caplog.text
    ownership.remember(written)
    assert ownership.is_ours(written)
