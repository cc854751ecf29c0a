"""max_ckpt_to_keep (roll.pipeline.phases.checkpoint.prune): the newest N complete checkpoints stay, the one
a resume reads is never deleted, and a kill in the middle of a deletion leaves nothing that looks
like a checkpoint."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from roll.pipeline.phases import checkpoint as ckpt

REPO = Path(__file__).parents[2]


def write(out, step):
    tmp = ckpt.begin(str(out), step)
    (tmp / "config.json").write_text("{}")
    (tmp / "model.safetensors").write_bytes(b"w" * 64)
    return ckpt.commit(str(out), tmp, step, {"kl_ctl": {"kl_coef": 0.1}})


def steps(out):
    return sorted(p.name for p in (Path(out) / "checkpoints").iterdir() if p.is_dir())


def test_keeps_the_newest_n_and_zero_keeps_all(tmp_path):
    for step in (1, 2, 3, 4, 5):
        write(tmp_path, step)
    assert ckpt.prune(str(tmp_path), 0) == []
    assert steps(tmp_path) == ["step_1", "step_2", "step_3", "step_4", "step_5"]
    deleted = ckpt.prune(str(tmp_path), 2)
    assert [p.name for p in deleted] == ["step_3", "step_2", "step_1"]
    assert steps(tmp_path) == ["step_4", "step_5"]
    assert ckpt.latest(str(tmp_path)).name == "step_5"


def test_never_deletes_the_checkpoint_latest_names(tmp_path):
    for step in (1, 2, 3):
        write(tmp_path, step)
    write(tmp_path, 2)  # a resumed run saving step 2 again: `latest` names step_2, older than step_3
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_2"
    ckpt.prune(str(tmp_path), 1)
    assert steps(tmp_path) == ["step_2"]
    assert ckpt.latest(str(tmp_path)).name == "step_2"


def test_a_kill_in_the_middle_of_a_deletion_leaves_no_half_checkpoint(tmp_path):
    for step in (1, 2, 3):
        write(tmp_path, step)
    # A process that starts removing the oldest checkpoint's files and is SIGKILLed after the first.
    script = textwrap.dedent(
        f"""
        import os, signal, shutil
        from pathlib import Path
        from roll.pipeline.phases import checkpoint as ckpt

        def rmtree_then_die(path, *args, **kwargs):
            next(p for p in Path(path).iterdir() if p.name == "trainer_state.json").unlink()
            os.kill(os.getpid(), signal.SIGKILL)

        ckpt.shutil.rmtree = rmtree_then_die
        ckpt.prune({str(tmp_path)!r}, 2)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, "-c", script], env=env, check=False)
    assert killed.returncode == -9
    root = tmp_path / "checkpoints"
    assert (root / ".deleting-step_1").is_dir()  # the half-deleted one, under a name no resume reads
    assert [p.name for p in ckpt.candidates(str(tmp_path))] == ["step_3", "step_2"]
    assert ckpt.latest(str(tmp_path)).name == "step_3"
    write(tmp_path, 4)
    ckpt.prune(str(tmp_path), 2)  # the next save's prune removes the leftover too
    assert steps(tmp_path) == ["step_3", "step_4"]
    assert not (root / ".deleting-step_1").exists()
