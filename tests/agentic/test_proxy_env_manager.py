"""Agent runners played by the env worker through the chat proxy: the built-in runners on our
FrozenLake against the tiny model's real inference worker, scripted tool calls, and episodes that
time out, fail or never call the model (dropped with a reason, nothing hangs)."""

from __future__ import annotations

import asyncio
import threading

import openai
import pytest

import envs  # noqa: F401  (registers the built-in envs)
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.proxy_env_manager import runner_class
from roll.agentic.episode import EnvSpec
from roll.agentic.proxy.runner import AgentRunner, EpisodeResult
from roll.agentic.proxy.runners import GEMRunner, ToolCallRunner
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.core.errors import EngineFailed
from roll.core.records import GenerateOutput, SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model

EXTRA = ["<answer>", "</answer>", "<tool_call>", "</tool_call>", '"name"', '"arguments"', '"act"', '"action"', '"Left"']


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    corpus = [FrozenLakeEnv.instruction, "Left Right Up Down"]
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", corpus=corpus, extra_tokens=EXTRA, seed=2)


class _Method:
    """`handle.method.remote(*args)` of a Ray actor handle, answered in-process."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class LocalInference:
    """A real `InferenceWorker` behind the actor-handle interface the env worker calls; every
    output it returned is kept, to compare the samples with."""

    def __init__(self, engine):
        self.engine, self.outputs = engine, []
        self.generate_many = _Method(self._generate_many)
        self.release_sessions = _Method(lambda sessions: None)

    async def _generate_many(self, requests):
        outs = await self.engine.generate_many(requests)
        self.outputs += outs
        return outs


def spec(runner: str, max_steps=3, **kw) -> EnvSpec:
    return EnvSpec(
        tag="Lake",
        env_type="frozen_lake",
        env_config={"max_path_length": 8},
        max_steps=max_steps,
        max_tokens_per_step=6,
        agent_runner_cls=runner,
        **kw,
    )


def play(
    model_dir, inference, env_spec, *, mode="traj", group_size=2, timeout=600.0, after=None, seq_len=2048, frames=False
):
    async def run():
        worker = EnvWorker(
            [env_spec],
            group_size,
            model_dir,
            inference,
            SamplingParams(max_new_tokens=32),
            seq_len,
            manager_type=mode,
            proxy={"episode_timeout_s": timeout},
        )
        try:
            result = await worker.run_group(0, GroupSpec(0, "g0", env_seed=5, sample_seed=9, keep_frames=frames))
            if after is not None:  # while the server still runs
                await asyncio.to_thread(after)
            return result
        finally:
            await worker._proxy.stop()

    return asyncio.run(run())


def test_roll_runner_paths_map_to_ours():
    assert runner_class("roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner") is GEMRunner
    assert runner_class("roll.pipeline.agentic.agent_runner.gem_runner.ToolCallRunner") is ToolCallRunner
    assert runner_class("roll.agentic.proxy.runners.ToolCallRunner") is ToolCallRunner


RUNNERS = [
    "roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner",  # ROLL's path, mapped to ours
    "examples.agent_proxy.openai_agent.OpenAIAgentRunner",  # bring your own agent: the openai client
    "examples.agent_proxy.langgraph_agent.LangGraphAgentRunner",  # ... and LangGraph + langchain-openai
]


@pytest.mark.parametrize("mode", ["traj", "step"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_runners_train_on_the_engines_ids_and_the_envs_rewards(model_dir, runner, mode):
    inference = LocalInference(InferenceWorker(model_dir, num_threads=1))
    result = play(model_dir, inference, spec(runner), mode=mode, frames=True)
    assert result.dropped == [] and len(result.trajectories) == 2
    assert max(t.num_actions for t in result.trajectories) >= 2  # multi-turn: later turns extend earlier ids
    by_request = {o.request_id: o for o in inference.outputs}
    for traj in result.trajectories:
        outs = [by_request[f"{traj.traj_id}/{k}"] for k in range(traj.metrics["proxy/generations"].__int__())]
        assert len(outs) == traj.num_actions == len(traj.step_rewards) <= 3
        if mode == "traj":
            generated = [t for t, m in zip(traj.token_ids, traj.response_mask, strict=True) if m]
            assert generated == sum((o.token_ids for o in outs), [])
            assert [p for p, m in zip(traj.infer_logprobs, traj.response_mask, strict=True) if m] == sum(
                (o.logprobs for o in outs), []
            )
        else:
            assert [s.response_ids for s in traj.steps] == [o.token_ids for o in outs]
            assert [s.logprobs for s in traj.steps] == [o.logprobs for o in outs]
            assert [s.reward for s in traj.steps] == traj.step_rewards
        # the rewards are the env's for the texts the engine wrote: replay them on a fresh env
        env = make_env("frozen_lake", {"max_path_length": 8})
        first_board, _ = env.reset(seed=5)
        assert traj.frames[0] == first_board and len(traj.frames) == len(traj.frame_captions) == len(outs)
        tok = load_tokenizer(model_dir)
        replayed = [env.step(tok.decode(o.token_ids, skip_special_tokens=True))[1] for o in outs]
        assert traj.step_rewards == pytest.approx(replayed)
        assert traj.metrics["proxy/forks"] == 0.0 and traj.metrics["proxy/overhead_ms_per_request"] > 0.0


class ScriptedTools:
    """An engine that answers every request with one `act` tool call (ids of the text, -0.5 each)."""

    def __init__(self, tokenizer, action="Left"):
        self.text = f'<tool_call>{{"name": "act", "arguments": {{"action": "{action}"}}}}</tool_call>'
        self.tokenizer, self.prompts = tokenizer, []
        self.generate_many = _Method(self._generate_many)
        self.release_sessions = _Method(lambda sessions: None)

    async def _generate_many(self, requests):
        outs = []
        for r in requests:
            self.prompts.append(r.prompt_ids)
            ids = self.tokenizer.encode(self.text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            outs.append(GenerateOutput(r.request_id, ids, [-0.5] * len(ids), "stop", policy_version=2))
        return outs


def test_tool_call_runner_turns_act_calls_into_env_actions(model_dir):
    engine = ScriptedTools(load_tokenizer(model_dir))
    result = play(model_dir, engine, spec("roll.agentic.proxy.runners:ToolCallRunner"), group_size=1)
    (traj,) = result.trajectories
    env = make_env("frozen_lake", {"max_path_length": 8})
    env.reset(seed=5)
    expected = []
    for _ in range(3):
        _, reward, terminated, truncated, _ = env.step("<answer>Left</answer>")
        expected.append(reward)
        if terminated or truncated:
            break
    assert traj.step_rewards == pytest.approx(expected) and traj.policy_version == 2
    # every later prompt extends the previous prompt and its generated ids
    for a, b in zip(engine.prompts, engine.prompts[1:], strict=False):
        assert b[: len(a)] == a


class SilentRunner(AgentRunner):
    """Never calls back until released; then tries its (revoked) token."""

    released = threading.Event()
    late: list = []

    def run_job(self, seed):
        SilentRunner.released.wait(30)
        try:
            self.client().chat.completions.create(model=self.model, messages=[{"role": "user", "content": "x"}])
        except openai.APIStatusError as e:
            SilentRunner.late.append(e.status_code)
        return EpisodeResult(score=1.0)


class RollStyleRunner(AgentRunner):
    """Written as ROLL's runners are: `httpx.Client` and the base class's `_llm_request`."""

    def run_job(self, seed):
        import httpx

        env = make_env("frozen_lake", {"max_path_length": 8})
        observation, _ = env.reset(seed=seed)
        with httpx.Client(timeout=60) as client:
            response = self._llm_request(client, [{"role": "user", "content": observation}])
        _, reward, *_ = env.step(response["choices"][0]["message"]["content"])
        return EpisodeResult(status="Finished", score=reward, step_scores=[reward])


def test_a_runner_written_for_roll_runs_unchanged(model_dir):
    inference = LocalInference(InferenceWorker(model_dir, num_threads=1))
    result = play(model_dir, inference, spec(f"{__name__}.RollStyleRunner"), group_size=1)
    (traj,) = result.trajectories
    (out,) = inference.outputs
    assert [t for t, m in zip(traj.token_ids, traj.response_mask, strict=True) if m] == out.token_ids


class FailingRunner(AgentRunner):
    def run_job(self, seed):
        return EpisodeResult(status="Failed", agent_exit_reason="sandbox crashed")


class NoCallRunner(AgentRunner):
    async def run_job(self, seed):
        return EpisodeResult(score=1.0)


def test_a_runner_that_never_calls_back_times_out_with_a_reason_and_its_token_dies(model_dir):
    inference = LocalInference(InferenceWorker(model_dir, num_threads=1))

    def release_and_wait_for_the_late_call():
        SilentRunner.released.set()
        for _ in range(600):
            if SilentRunner.late:
                return
            threading.Event().wait(0.05)

    result = play(
        model_dir,
        inference,
        spec(f"{__name__}:SilentRunner"),
        group_size=1,
        timeout=0.5,
        after=release_and_wait_for_the_late_call,
    )
    assert result.trajectories == []
    assert result.dropped == [
        "Lake g0-0: EpisodeFailed: episode timeout: the runner did not return within 0.5s (0 requests served)"
    ]
    assert SilentRunner.late == [410] and inference.outputs == []  # its late call was refused, not served


@pytest.mark.parametrize(
    ("runner", "reason"),
    [
        ("FailingRunner", "Lake g0-0: EpisodeFailed: runner status 'Failed': sandbox crashed"),
        ("NoCallRunner", "Lake g0-0: EpisodeFailed: the runner finished without calling the model"),
    ],
)
def test_failed_and_silent_episodes_are_dropped_with_their_reason(model_dir, runner, reason):
    inference = LocalInference(InferenceWorker(model_dir, num_threads=1))
    result = play(model_dir, inference, spec(f"{__name__}:{runner}"), group_size=1)
    assert result.trajectories == [] and result.dropped == [reason]


class BrokenEngine:
    """An inference worker whose engine has failed (`EngineFailed` on every request)."""

    def __init__(self):
        self.generate_many = _Method(self._generate_many)
        self.release_sessions = _Method(lambda sessions: None)

    async def _generate_many(self, requests):
        raise EngineFailed("engine failed: CUDA error (scripted)")


def test_an_engine_failure_seen_by_the_proxy_stops_the_run(model_dir):
    with pytest.raises(EngineFailed, match="scripted"):
        play(model_dir, BrokenEngine(), spec("roll.agentic.proxy.runners:GEMRunner"), group_size=1)


def test_a_conversation_out_of_room_stops_the_episode_with_max_tokens(model_dir):
    inference = LocalInference(InferenceWorker(model_dir, num_threads=1))
    # the first prompt (instruction + grid) fits; the second turn's does not
    first = play(model_dir, inference, spec("roll.agentic.proxy.runners:GEMRunner"), group_size=1)
    assert first.trajectories[0].num_actions >= 2
    prompt = first.trajectories[0].response_mask.index(1)
    result = play(model_dir, inference, spec("roll.agentic.proxy.runners:GEMRunner"), group_size=1, seq_len=prompt + 7)
    (traj,) = result.trajectories
    assert traj.stop_reason == "max_tokens" and traj.num_actions == 1
