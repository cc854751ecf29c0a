"""Rendezvous files of ended processes do not pile up in the temp dir."""

import os
import subprocess
import sys
import tempfile

from roll.distributed.strategies import process_group as pg


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_files_of_ended_processes_go_and_the_rest_stay(tmp_path):
    dead = tmp_path / f"roll-pg-{_ended_pid()}-abc"
    mine = tmp_path / f"roll-pg-{os.getpid()}-def"
    other = tmp_path / "roll-pg-notapid-x"
    unrelated = tmp_path / "something-else"
    for path in (dead, mine, other, unrelated):
        path.write_text("")
    assert pg.remove_stale_store_files(str(tmp_path)) == [str(dead)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (mine, other, unrelated))


def test_a_fresh_store_file_sweeps_first_and_is_named_after_its_maker(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"roll-pg-{_ended_pid()}-abc"
    dead.write_text("")
    path = pg.fresh_store_file()
    assert not dead.exists()
    assert os.path.dirname(path) == str(tmp_path)
    assert os.path.basename(path).startswith(f"roll-pg-{os.getpid()}-")
    assert path != pg.fresh_store_file()
