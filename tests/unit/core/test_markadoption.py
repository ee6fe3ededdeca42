"""multusd.core.markadoption: the marks of failed DELs wherever the node keeps them, each found
beside its records, strays moved there, the marks of released sandboxes dropped."""

from __future__ import annotations

import os

from multusd.core import delmarks, markadoption, unreleased
from multusd.wire import delwindow
from failingdel import CONF, FAILED, del_request, write_records


def test_clear_never_fails_a_del_and_tidy_drops_marks_of_released_sandboxes(tmp_path):
    cni_dir, spare = str(tmp_path / "cni"), str(tmp_path / "run" / ".multusd-unreleased")
    os.makedirs(cni_dir)
    (tmp_path / "cni" / ".multusd-unreleased").write_text("in the way")
    assert delmarks.clear(cni_dir, "c0ffee", spare=spare) is False
    unreleased.record(cni_dir, del_request(cni_dir), FAILED, "m", window=1, now=1.0,
                      spare=spare)
    assert markadoption.tidy([cni_dir], spare) == markadoption.Tidied(dropped=("c0ffee",))
    assert delmarks.read_all(cni_dir, spare=spare) == {}


def shim_mark(cni_dir: str, cid: str, socket_dir: str = "") -> None:
    """The shim's mark of ``cid``'s failed DEL in ``cni_dir`` (its config names that one)."""
    req = del_request(cni_dir, cid)
    assert delwindow.note_failure({"cniDir": cni_dir}, dict(req.env), CONF, "not reachable",
                                  now=1000.0, socket_dir=socket_dir) is not None


def test_a_sandbox_has_records_while_a_scratch_cache_or_a_result_entry_is_left(tmp_path):
    cni_dir = str(tmp_path)
    assert not markadoption.has_records(cni_dir, "c0ffee")
    write_records(cni_dir, "c0ffee")
    assert markadoption.has_records(cni_dir, "c0ffee")
    os.unlink(os.path.join(cni_dir, "c0ffee"))
    os.makedirs(os.path.join(cni_dir, "results"))
    open(os.path.join(cni_dir, "results", "net-a-c0ffee-eth0"), "w").close()
    assert markadoption.has_records(cni_dir, "c0ffee")
    assert not markadoption.has_records(cni_dir, "c0ffe")  # the whole ID, never a prefix


def test_marks_in_another_cni_dir_than_their_records_are_moved_beside_them(tmp_path):
    # a shim whose config names no cniDir marked in the default one, the records are here
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    write_records(cni_dir, "moved")
    write_records(cni_dir, "both")
    write_records(default, "theirs")  # that directory's own sandbox
    for cid in ("moved", "both", "theirs"):
        shim_mark(default, cid)
    unreleased.record(cni_dir, del_request(cni_dir, "both"), FAILED, "m", window=60, now=990.0)

    tidied = markadoption.tidy([cni_dir, default])

    assert sorted(tidied.moved) == ["both", "moved"] and tidied.dropped == ()
    moved = delmarks.read(cni_dir, "moved")
    assert (moved.by, moved.cni_dir, moved.first_failure) == ("shim", cni_dir, 1000.0)
    assert delmarks.read(cni_dir, "both").by == "daemon"  # the daemon's own stands
    assert delmarks.read(default, "moved") is None and delmarks.read(default, "both") is None
    assert delmarks.read(default, "theirs") is not None  # beside its own records: stays
    assert markadoption.tidy([cni_dir, default, cni_dir]) == markadoption.Tidied()


def test_every_reader_finds_a_mark_where_its_records_are_whatever_cni_dir_it_names(tmp_path):
    # the shim (its config naming the default cniDir, which could not take the mark) marked
    # beside the socket; the records are in the daemon's cniDir: unreleased, found, not
    # dropped (judged by the cniDir it names alone, the default one, it was never retried)
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    spare = delmarks.spare_marks_dir(str(tmp_path / "run"))
    os.makedirs(default)
    with open(os.path.join(default, ".multusd-unreleased"), "w") as handle:
        handle.write("a file where the marks' directory should be")
    write_records(cni_dir, "held")
    shim_mark(default, "held", socket_dir=str(tmp_path / "run"))
    assert delmarks.read(default, "held", spare=spare).cni_dir == default
    node = [cni_dir, default]

    [found] = unreleased.unreleased(node, spare=spare)

    assert (found.container_id, found.cni_dir, found.place) == ("held", cni_dir, spare)
    assert markadoption.mark_of(node, "held", spare) == found
    assert markadoption.records_dir(found, node) == cni_dir
    assert markadoption.tidy(node, spare) == markadoption.Tidied()  # where it can be: stays
    assert unreleased.count_unreleased([default], spare=spare) == 0  # not a reader of node's
    os.unlink(os.path.join(cni_dir, "held"))
    assert unreleased.unreleased(node, spare=spare) == []
    assert markadoption.tidy(node, spare).dropped == ("held",)
    assert delmarks.read_in(spare, "held") is None


def test_one_mark_per_sandbox_the_one_beside_its_records(tmp_path):
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    write_records(cni_dir, "c0ffee")
    shim_mark(default, "c0ffee")  # a stray copy, and the daemon's own beside the records
    unreleased.record(cni_dir, del_request(cni_dir), FAILED, "m", window=60, now=990.0)

    for node in ([cni_dir, default], [default, cni_dir]):
        marks = markadoption.node_marks(node)
        assert list(marks) == ["c0ffee"] and marks["c0ffee"].by == "daemon"
        assert markadoption.mark_of(node, "c0ffee") == marks["c0ffee"]
    assert markadoption.node_marks([default]) == {}  # its records are not where it looks


def test_a_released_sandboxs_stray_marks_go_after_its_del(tmp_path):
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    for cid in ("released", "held-here", "held-there", "other"):
        shim_mark(default, cid)
    write_records(cni_dir, "held-here")
    write_records(default, "held-there")
    node = [cni_dir, default]

    assert markadoption.drop_if_released(node, "held-here") is False
    assert markadoption.drop_if_released(node, "released") is True
    assert delmarks.read(default, "other") is not None  # only that one
    assert markadoption.drop_if_released(node, "no-such") is False
    assert markadoption.drop_if_released([cni_dir], "held-there") is False  # not looked at
    assert markadoption.tidy(node) == markadoption.Tidied(moved=("held-here",),
                                                          dropped=("other",))
    assert list(delmarks.read_all(default)) == ["held-there"]
    assert list(delmarks.read_all(cni_dir)) == ["held-here"]


def test_a_mark_naming_its_cni_dir_another_way_is_where_it_belongs(tmp_path):
    cni_dir = str(tmp_path / "cni")
    os.symlink(cni_dir, str(tmp_path / "link"))
    write_records(cni_dir, "c0ffee")
    unreleased.record(str(tmp_path / "link") + "/", del_request(cni_dir), FAILED, "m",
                      window=60, now=990.0)  # the request's cniDir, spelled another way

    assert markadoption.tidy([cni_dir, str(tmp_path / "link")]) == markadoption.Tidied()
    assert markadoption.node_marks([cni_dir])["c0ffee"].cni_dir == cni_dir
    assert delmarks.read(cni_dir, "c0ffee") is not None  # never moved onto itself, and lost


def test_show_and_status_name_the_same_mark_when_none_is_beside_the_records(tmp_path):
    # the records' cniDir cannot take a mark (the daemon's went beside the socket), and a
    # shim marked in another cniDir: every reader takes the daemon's (mark_of read the first
    # place it looked, so `multusd show` named the shim's while status named the daemon's)
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    spare = delmarks.spare_marks_dir(str(tmp_path / "run"))
    write_records(cni_dir, "c0ffee")
    (tmp_path / "cni" / ".multusd-unreleased").write_text("in the way")
    unreleased.record(cni_dir, del_request(cni_dir), FAILED, "m", window=60, now=990.0,
                      spare=spare)
    shim_mark(default, "c0ffee")

    for node in ([cni_dir, default], [default, cni_dir]):
        marks = markadoption.node_marks(node, spare)
        assert (marks["c0ffee"].by, marks["c0ffee"].place) == ("daemon", spare)
        assert markadoption.mark_of(node, "c0ffee", spare) == marks["c0ffee"]
