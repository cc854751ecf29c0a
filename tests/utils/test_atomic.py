import os
import stat

import pytest

from roll.utils import atomic
from roll.utils.atomic import atomic_dir, write_atomic


def test_writes_text_and_bytes_and_replaces_the_old_file(tmp_path):
    path = tmp_path / "state.json"
    assert write_atomic(path, "first ü") == path
    assert path.read_text(encoding="utf-8") == "first ü"
    write_atomic(str(path), b"\x00second")
    assert path.read_bytes() == b"\x00second"
    assert os.listdir(tmp_path) == ["state.json"]  # no temporary file left


def test_a_write_that_fails_part_way_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "latest"
    write_atomic(path, "step_1")

    def disk_error(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic.os, "fsync", disk_error)  # the new bytes are written, not yet durable
    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(path, "step_2")
    assert path.read_text() == "step_1"
    assert os.listdir(tmp_path) == ["latest"]


def test_the_file_then_the_directory_are_fsynced_before_it_returns(tmp_path, monkeypatch):
    synced, replaced = [], []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    def replace(src, dst):
        replaced.append(len(synced))  # how many fsyncs came before the rename
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    write_atomic(tmp_path / "placement.json", "{}")
    assert synced == ["file", "dir"] and replaced == [1]


def test_the_parent_directory_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f", "x")
    assert os.listdir(tmp_path) == []


def test_a_directory_built_whole_replaces_the_old_one_and_leaves_no_sibling(tmp_path):
    final = tmp_path / "model"
    final.mkdir()
    (final / "config.json").write_text("old")
    with atomic_dir(final) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".model.")
        (tmp / "config.json").write_text("new")
        assert (final / "config.json").read_text() == "old"  # readers see the old dir until the end
    assert (final / "config.json").read_text() == "new"
    assert os.listdir(tmp_path) == ["model"]


def test_a_directory_build_that_fails_keeps_the_old_dir_and_leaves_no_sibling(tmp_path):
    final = tmp_path / "model"
    final.mkdir()
    (final / "config.json").write_text("old")
    with pytest.raises(RuntimeError, match="killed"), atomic_dir(final) as tmp:
        (tmp / "config.json").write_text("half")
        raise RuntimeError("killed")
    assert (final / "config.json").read_text() == "old"
    assert os.listdir(tmp_path) == ["model"]
