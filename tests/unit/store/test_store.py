"""multusd.store: atomic writes, durable or not, and the fsync that can follow one."""

import logging
import os
import stat

from multusd import store


def test_atomic_write_replaces_the_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "file"
    store.atomic_write(str(path), b"one")
    store.atomic_write(str(path), b"two", durable=False, mode=0o640)
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "sub").stat().st_mode) == 0o700
    assert os.listdir(tmp_path / "sub") == ["file"]


def test_a_flush_after_a_write_that_was_not_durable(tmp_path, caplog):
    path = tmp_path / "scratch"
    store.atomic_write(str(path), b"{}", durable=False)
    with caplog.at_level(logging.WARNING):
        store.Flush(str(path)).wait()
    assert path.read_bytes() == b"{}" and not caplog.records


def test_a_flush_of_a_file_removed_meanwhile_is_quiet(tmp_path, caplog):
    path = tmp_path / "scratch"
    store.atomic_write(str(path), b"{}", durable=False)
    store.remove(str(path))
    with caplog.at_level(logging.WARNING):
        store.Flush(str(path)).wait()
    assert not caplog.records
