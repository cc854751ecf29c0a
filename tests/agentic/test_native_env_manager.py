"""ROLL's native step manager (roll.agentic.env_manager.native_env_manager) and the Sokoban that
keeps its own chat (envs.sokoban.native), driven by a scripted engine: exact prompts and samples."""

import asyncio

import pytest

import envs  # noqa: F401  (registers the built-in envs)
from envs.sokoban.native import INVALID_TIP, SokobanNativeEnv
from roll.agentic.env_manager.base import MalformedEnvOutput
from roll.agentic.env_manager.native_env_manager import NativeStepEnvManager, chat_hash, chat_of
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.chat_template import chat_template_ids
from roll.models.tiny import build_tiny_tokenizer

SEED = 5


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(corpus=[SokobanNativeEnv.instruction])


def test_the_env_writes_the_chat():
    env = SokobanNativeEnv(dim_room=(5, 5), max_steps=4, system_template="Play.")
    obs, info = env.reset(seed=SEED)
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert info["messages"][0]["content"] == f"Play.\n\n{info['env_instruction']}"
    assert info["messages"][1]["content"].startswith(f"Here is the current state:\n{obs}\n\n")
    obs, _, _, _, info = env.step("no answer here")  # invalid: the reminder comes first
    assert [m["role"] for m in info["messages"]] == ["system", "user", "assistant", "user"]
    assert info["messages"][2]["content"] == "no answer here"
    assert info["messages"][3]["content"].startswith(INVALID_TIP + f"Current state:\n{obs}")
    move = env.scripted_action()
    obs, _, _, _, info = env.step(f"<answer>{move}</answer>")
    assert info["action_is_valid"] and info["messages"][5]["content"].startswith(f"Current state:\n{obs}")
    info["messages"].clear()
    assert len(env.messages) == 6  # handed out as a copy


def test_chat_of_refuses_an_env_without_a_chat():
    assert chat_of({"messages": [{"role": "user", "content": "hi"}]}, "T") == [{"role": "user", "content": "hi"}]
    for info in ({}, {"messages": []}, {"messages": [{"role": "user"}]}, {"messages": "hi"}):
        with pytest.raises(MalformedEnvOutput, match="T: a native env hands its chat out as info"):
            chat_of(info, "T")


class ScriptedEngine:
    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.prompts = tokenizer, list(answers), []

    async def __call__(self, request):
        self.prompts.append(list(request.prompt_ids))
        ids = self.tokenizer.encode(self.answers[len(self.prompts) - 1], add_special_tokens=False)
        return GenerateOutput(request.request_id, ids, [-0.25] * len(ids), "stop", policy_version=3)


def test_each_step_is_a_sample_whose_prompt_is_the_envs_chat(tokenizer):
    config = {"dim_room": [5, 5], "max_steps": 3}
    spec = EnvSpec(
        tag="Native",
        env_type="sokoban_native_env",
        env_config=config,
        max_steps=3,
        max_tokens_per_step=8,
        agent_template="not read",
        native_chat=True,
    )
    engine = ScriptedEngine(tokenizer, ["Up", "Left", "Down"])
    manager = NativeStepEnvManager(spec, tokenizer, engine, SamplingParams(max_new_tokens=8), sequence_length=4096)
    traj = asyncio.run(manager.run_episode(EpisodeSpec("g0", "g0-0", env_seed=SEED, sample_seed=1)))

    replay = SokobanNativeEnv(**config)
    _, info = replay.reset(seed=SEED)
    assert traj.token_ids == [] and [s.step for s in traj.steps] == [0, 1, 2]
    for k, step in enumerate(traj.steps):
        assert step.prompt_ids == chat_template_ids(tokenizer, info["messages"], add_generation_prompt=True)
        assert step.prompt_ids == engine.prompts[k] and step.state_hash == chat_hash(info["messages"])
        assert step.response_ids == tokenizer.encode(engine.answers[k], add_special_tokens=False)
        assert step.logprobs == [-0.25] * len(step.response_ids)
        _, reward, *_, info = replay.step(tokenizer.decode(step.response_ids, skip_special_tokens=True))
        assert step.reward == reward == traj.step_rewards[k]
    assert len(traj.steps[2].prompt_ids) > len(traj.steps[1].prompt_ids) > len(traj.steps[0].prompt_ids)
