"""Checkpoint directories: atomic commit, the `latest` marker, and what counts as complete."""

import json
import re

import pytest

from roll.pipeline.phases import checkpoint as ckpt


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
    with pytest.raises(ckpt.CheckpointDamaged, match="resume_from_checkpoint"):
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


def write_full(out, step):
    """A checkpoint with the files a training role writes (tiny but real formats)."""
    import torch
    from safetensors.torch import save_file

    tmp = ckpt.begin(str(out), step)
    (tmp / "config.json").write_text('{"model_type": "llama"}')
    save_file({"w": torch.full((64,), float(step))}, str(tmp / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.ones(64)}}, "param_groups": []}, tmp / "optimizer.pt")
    torch.save({"last_epoch": step}, tmp / "scheduler.pt")
    (tmp / "critic").mkdir()
    save_file({"v": torch.zeros(8)}, str(tmp / "critic" / "model.safetensors"))
    return ckpt.commit(str(out), tmp, step, {"kl_ctl": {"kl_coef": 0.1}})


def truncate(file):
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def garble(file):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("name", "spoil", "why"),
    [
        ("model.safetensors", truncate, r"model.safetensors: 164 bytes, the manifest says 328"),
        ("optimizer.pt", garble, r"optimizer.pt: its sha256 differs from the manifest's"),
        ("scheduler.pt", lambda f: f.write_bytes(b""), r"scheduler.pt: 0 bytes, the manifest says \d+"),
        ("trainer_state.json", truncate, r"trainer_state.json: \d+ bytes, the manifest says \d+"),
        ("critic/model.safetensors", garble, r"critic/model.safetensors: its sha256 differs from the manifest's"),
        ("optimizer.pt", lambda f: f.unlink(), r"optimizer.pt: missing"),
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_previous_one_with_one_warning(tmp_path, caplog, name, spoil, why):
    write_full(tmp_path, 1)
    step_2 = write_full(tmp_path, 2)
    spoil(step_2 / name)
    with caplog.at_level("WARNING", logger="roll"):
        chosen = ckpt.resolve_resume(True, str(tmp_path))
    assert chosen.name == "step_1"
    [line] = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(rf"damaged checkpoint skipped: step_2 \({why}\); resuming from step_1", line), line
    assert "weights_only" not in caplog.text
    with pytest.raises(ckpt.CheckpointDamaged, match=rf"step_2 is damaged \({why}\)"):  # named explicitly: refused
        ckpt.resolve_resume(str(step_2), str(tmp_path))


def test_manifest_lists_every_file_and_an_intact_checkpoint_passes(tmp_path):
    path = write_full(tmp_path, 3)
    files = json.loads((path / "manifest.json").read_text())["files"]
    assert sorted(files) == [
        "config.json",
        "critic/model.safetensors",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "trainer_state.json",
    ]
    assert files["scheduler.pt"]["size"] == (path / "scheduler.pt").stat().st_size
    assert ckpt.damage(path) is None and ckpt.latest(str(tmp_path)) == path
