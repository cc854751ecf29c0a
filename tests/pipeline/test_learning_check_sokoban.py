"""The Sokoban example still learns: its own config through the CLI for 100 steps (of its 200), the
default seed, validation on its first 64 levels every 25 steps (a lane: about 9 minutes on 2 cores,
so not in .ci/run).

Measured with this exact command (benchmarks/results/learning.md, "Sokoban learning check"): the
untrained policy scores 0.000 (it answers no valid action), 0.297 at step 25, 0.453 at 50, 0.562
at 75 and 0.594 at step 100. A uniformly random valid action on every turn solves 0.314 of the
validation levels (benchmarks/learning/random_baseline.py), so the check asks for clearly more
than random play: 0.45. Below that, learning broke (a loss sign, an advantage, a weight sync) or
only the answer format was learnt. Deterministic on CPU: the same machine gives the same number."""

import pytest

from tests.conftest import run_example

pytestmark = [pytest.mark.ray, pytest.mark.lane]
MIN_SUCCESS_AT_100 = 0.45
RANDOM_VALID = 0.314  # random_baseline.py --config_path sokoban --config_name agent_val_sokoban --seeds 42


@pytest.fixture(scope="module")
def sokoban_model(tmp_path_factory) -> str:
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "sokoban", "--output_dir", str(tmp_path_factory.mktemp("m") / "tiny")])


@pytest.mark.timeout(1800)
def test_the_sokoban_example_beats_random_play_within_100_steps(tmp_path, sokoban_model):
    _, rows = run_example(
        tmp_path / "run",
        "--config_path",
        "sokoban",
        "--config_name",
        "agent_val_sokoban",
        f"pretrain={sokoban_model}",
        "max_steps=100",
        "eval_steps=25",
        "save_steps=0",
        "val_batch_size=64",
        "val_env_manager.num_env_groups=64",
        timeout=1700,
    )
    val = {r["step"]: r["val/success"] for r in rows if "val/success" in r}
    assert sorted(val) == [0, 25, 50, 75, 100]
    assert val[0] < 0.1  # the untrained policy
    assert MIN_SUCCESS_AT_100 > RANDOM_VALID + 0.1  # the premise: the bar is well above random play
    assert val[100] >= MIN_SUCCESS_AT_100, f"val/success at step 100: {val[100]:.3f}"
