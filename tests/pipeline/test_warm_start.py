"""The warm start: the teacher plays through the experiment's own env manager (its samples are the
manager's), and imitation teaches a random-init tiny model to answer in the env's format."""

import json
import math

import numpy as np
import pytest
import torch

import envs  # noqa: F401  registers the built-ins
from roll.agentic.env import TextEnv
from roll.agentic.env_manager.factory import make_env_manager
from roll.agentic.episode import EnvSpec
from roll.core.enums import SampleMode
from roll.core.records import SamplingParams
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model
from roll.pipeline import warm_start
from roll.pipeline.tiny_model import env_corpus

MOVES = ("Left", "Down", "Right", "Up")
SPEC = EnvSpec(
    tag="FL", env_type="frozen_lake", env_config={}, max_steps=8, max_tokens_per_step=4, response_prefix="<answer>"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", corpus=env_corpus("frozen_lake", {"show_neighbours": True}, num_seeds=5)
    )


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


def play(tokenizer, mode, seeds, seed=7):
    teacher = warm_start.Teacher(tokenizer, "<answer>", np.random.default_rng(seed))
    manager = make_env_manager(
        SPEC, tokenizer, teacher.generate, SamplingParams(max_new_tokens=4), 2048, mode=mode, history_length=0
    )
    return warm_start.teacher_samples(manager, teacher, seeds), manager


def answer_ids(tokenizer, move):
    return tokenizer.encode(f"{move}</answer>", add_special_tokens=False)


def test_trajectory_wise_the_sample_is_the_conversation_with_the_answers_masked(tokenizer):
    (sample,), manager = play(tokenizer, SampleMode.TRAJ, [3])
    env = manager.env.unwrapped
    rng = np.random.default_rng(7)  # the teacher's draws again: uniform over the 4 moves
    obs, info = env.reset(seed=3)
    assert sample["token_ids"][
        : len(manager.chat.initial_prompt(info["env_instruction"], obs))
    ] == manager.chat.initial_prompt(info["env_instruction"], obs)
    masked = [t for t, m in zip(sample["token_ids"], sample["response_mask"]) if m]
    moves, expected = [], []
    for _ in range(8):
        move = env.sample_valid_action(rng).removeprefix("<answer>").removesuffix("</answer>")
        moves.append(move)
        expected += answer_ids(tokenizer, move)
        _, _, terminated, truncated, _ = env.step(f"<answer>{move}</answer>")
        if terminated or truncated:
            break
    assert masked == expected and set(moves) <= set(MOVES)


def test_step_wise_every_step_is_its_prompt_then_its_answer(tokenizer):
    samples, _ = play(tokenizer, SampleMode.STEP, [3, 4])
    assert len(samples) > 2
    for s in samples:
        answer = [t for t, m in zip(s["token_ids"], s["response_mask"]) if m]
        assert s["response_mask"] == sorted(s["response_mask"])  # prompt (0) first, then the answer (1)
        assert answer in [answer_ids(tokenizer, m) for m in MOVES]


def test_batch_tensors_pad_right_and_label_only_answers():
    batch = warm_start.batch_tensors(
        [{"token_ids": [5, 6, 7], "response_mask": [0, 1, 1]}, {"token_ids": [8, 9], "response_mask": [0, 1]}], pad_id=0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, 9, -100]]


def test_imitation_teaches_the_format_and_main_writes_a_loadable_model(model_dir, tmp_path):
    """The FrozenLake example's config, its tiny model random-init: after 400 steps of imitating the
    uniform teacher it answers with valid moves. The answer loss falls from about ln(vocab) to near
    the teacher's floor: per answer one uniform choice of 4 moves (ln 4) and a certain `</answer>`
    (0), i.e. ln(4) / 2 per answer token (`last_loss`: the mean of the last 10 steps)."""
    out = tmp_path / "warm"
    warm_start.main(
        [
            "--config_path",
            "frozen_lake",
            "--config_name",
            "agent_val_frozen_lake",
            "--output_dir",
            str(out),
            "--episodes",
            "128",
            "--steps",
            "400",
            "--batch_size",
            "16",
            f"pretrain={model_dir}",
        ]
    )
    record = json.loads((out / "warm_start.json").read_text())
    tokenizer = load_tokenizer(out)
    assert (record["tag"], record["env_type"]) == ("FrozenLake", "frozen_lake")
    assert record["first_loss"] > 0.7 * math.log(tokenizer.vocab_size)
    assert math.log(4) / 2 - 0.1 < record["last_loss"] < math.log(4) / 2 + 0.25
    model = load_causal_lm(out, training=False)
    samples, _ = play(tokenizer, SampleMode.STEP, [100])  # the step-wise prompts of a new map
    prompt = [t for t, m in zip(samples[0]["token_ids"], samples[0]["response_mask"]) if not m]
    torch.manual_seed(0)
    ids = model.generate(torch.tensor([prompt] * 20), max_new_tokens=2, do_sample=True, pad_token_id=0)
    answers = {tokenizer.decode(row[len(prompt) :]).replace(" ", "") for row in ids.tolist()}
    assert answers <= {f"{m}</answer>" for m in MOVES} and len(answers) > 1  # valid, and still varied


class _OpenText(TextEnv):
    """An env whose actions are open text and that lists none: no teacher."""

    def _reset(self, options):
        return "say something"

    def _apply(self, action):
        return "ok", 0.0, True, False

    @property
    def success(self):
        return False


def test_an_env_without_a_teacher_is_refused(tokenizer):
    teacher = warm_start.Teacher(tokenizer, "<answer>", np.random.default_rng(0))
    teacher.env = _OpenText()
    with pytest.raises(ValueError, match="_OpenText has no teacher"):
        import asyncio

        asyncio.run(teacher.generate(None))


def test_a_tag_not_in_custom_envs_is_a_config_error(model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        warm_start.main(
            [
                "--config_path",
                "frozen_lake",
                "--config_name",
                "agent_val_frozen_lake",
                "--output_dir",
                str(tmp_path / "w"),
                "--tag",
                "Nope",
                f"pretrain={model_dir}",
            ]
        )
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == ("config error: --tag: 'Nope' is not under custom_envs (FrozenLake)")


def test_the_teacher_method_answers_and_a_bad_one_is_refused(tokenizer, model_dir, tmp_path, capsys):
    class _Env(_OpenText):
        def sample_yes_action(self, rng):
            return "<answer>Left</answer>"

    teacher = warm_start.Teacher(tokenizer, "<answer>", np.random.default_rng(0), method="sample_yes_action")
    teacher.env = _Env()
    import asyncio

    out = asyncio.run(teacher.generate(type("R", (), {"request_id": "r"})()))
    assert tokenizer.decode(out.token_ids).replace(" ", "") == "Left</answer>"
    args = ["--config_path", "frozen_lake", "--config_name", "agent_val_frozen_lake", "--output_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        warm_start.main([*args, "--teacher", "sample_shopper_action", f"pretrain={model_dir}"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip() == "config error: --teacher: FrozenLakeEnv has no method sample_shopper_action"
    )
    with pytest.raises(SystemExit) as exit_info:
        warm_start.main([*args, "--teacher", "close", f"pretrain={model_dir}"])
    assert exit_info.value.code == 2 and "--teacher must name an env method sample_*_action" in capsys.readouterr().err
