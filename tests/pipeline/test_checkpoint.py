"""Checkpoint directories: atomic commit, the `latest` marker, and what counts as complete."""

import json

import pytest

from roll.pipeline import checkpoint as ckpt


def write(out, step, state=None):
    tmp = ckpt.begin(str(out), step)
    (tmp / "config.json").write_text("{}")
    return ckpt.commit(str(out), tmp, step, state or {"kl_ctl": {"kl_coef": 0.1}})


def test_commit_renames_and_points_latest(tmp_path):
    path = write(tmp_path, 2)
    assert path == tmp_path / "checkpoints" / "step_2"
    assert not (tmp_path / "checkpoints" / ".tmp-step_2").exists()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_2"
    assert json.loads((path / "trainer_state.json").read_text()) == {"step": 2, "kl_ctl": {"kl_coef": 0.1}}
    write(tmp_path, 4)
    assert ckpt.latest(str(tmp_path)).name == "step_4"
    assert ckpt.read_state(ckpt.latest(str(tmp_path)))["step"] == 4


def test_half_written_checkpoints_are_never_chosen(tmp_path):
    write(tmp_path, 2)
    ckpt.begin(str(tmp_path), 4)  # killed while writing step 4: only the temp dir exists
    assert ckpt.latest(str(tmp_path)).name == "step_2"
    # a marker naming an incomplete dir (e.g. deleted by hand) falls back to the newest complete one
    (tmp_path / "checkpoints" / "step_6").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_6")
    assert ckpt.latest(str(tmp_path)).name == "step_2"


def test_resolve_resume(tmp_path):
    assert ckpt.resolve_resume(False, str(tmp_path)) is None
    assert ckpt.resolve_resume(True, str(tmp_path)) is None  # nothing yet: start fresh
    path = write(tmp_path, 3)
    assert ckpt.resolve_resume(True, str(tmp_path)) == path
    assert ckpt.resolve_resume(str(path), str(tmp_path)) == path
    with pytest.raises(FileNotFoundError, match="resume_from_checkpoint"):
        ckpt.resolve_resume(str(tmp_path / "nope"), str(tmp_path))


def test_rewriting_a_step_replaces_it(tmp_path):
    write(tmp_path, 2, {"kl_ctl": {"kl_coef": 0.1}})
    write(tmp_path, 2, {"kl_ctl": {"kl_coef": 0.2}})
    assert ckpt.read_state(tmp_path / "checkpoints" / "step_2")["kl_ctl"] == {"kl_coef": 0.2}


def test_a_kill_while_a_step_is_rewritten_never_exposes_a_half_deleted_one(tmp_path, monkeypatch):
    """Rewriting step_2 (a run resumed from an earlier path) moves the old one aside first: killed
    between that and the new one's rename, no step_2 exists at all, and resuming falls back to
    step_1 instead of loading a directory that was half deleted."""
    write(tmp_path, 1)
    write(tmp_path, 2)
    renames = []

    def killed_at_second_rename(src, dst):
        renames.append((src, dst))
        if len(renames) == 2:
            raise KeyboardInterrupt("killed")
        return real_rename(src, dst)

    real_rename = ckpt.os.rename
    monkeypatch.setattr(ckpt.os, "rename", killed_at_second_rename)
    with pytest.raises(KeyboardInterrupt):
        write(tmp_path, 2, {"kl_ctl": {"kl_coef": 0.2}})
    monkeypatch.undo()
    assert not (tmp_path / "checkpoints" / "step_2").exists()
    assert ckpt.latest(str(tmp_path)).name == "step_1"
    write(tmp_path, 2, {"kl_ctl": {"kl_coef": 0.3}})  # the next save cleans up and commits
    assert ckpt.read_state(ckpt.latest(str(tmp_path)))["kl_ctl"] == {"kl_coef": 0.3}
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_1", "step_2"]
