"""The sandboxed coding env played through the chat proxy by `ToolCallRunner`: the model's OpenAI
`tool_calls` (`bash`, `python`, `write`, `submit`) run in the episode's sandbox, their results come
back as `tool` messages, the hidden tests give the reward, escape attempts made through a tool call
are contained and named, and the trained sequence is exactly the engine's ids.

The model is scripted: an engine that writes, call by call, the Hermes `<tool_call>` blocks of a
script (the expert's solution, a wrong one, an escape attempt). Everything between it and the
sandbox is real: the env worker, the proxy server on a loopback port, the runner's `openai` client.
A byte-level tokenizer round-trips the scripts' code exactly (the tiny word-level one drops
indentation)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast

import envs  # noqa: F401  (registers the built-in envs)
from envs.code_sandbox.env import TOOL_SCHEMAS, CodeSandboxEnv
from envs.code_sandbox.tasks import TASKS_BY_NAME
from roll.agentic.episode import EnvSpec
from roll.agentic.proxy.runners import ToolCallRunner
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.agentic.sandbox.isolation import choose_mode, seccomp_available
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.tiny import CHAT_TEMPLATE, IM_END, IM_START, PAD

NAMESPACES = choose_mode("auto") == "namespaces"
ADD = TASKS_BY_NAME["add"]
ESCAPE_FILE = "/etc/roll_proxy_tool_escape"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer without merges (every byte a token) and the tiny model's chat
    template: decode(encode(text)) == text for any text."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (PAD, IM_START, IM_END)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=IM_END, chat_template=CHAT_TEMPLATE
    )
    out = tmp_path_factory.mktemp("bytes")
    tokenizer.save_pretrained(out)
    LlamaConfig(vocab_size=len(tokenizer)).save_pretrained(out)  # a model dir; the scripted model has no weights
    return str(out)


def call(name: str, **arguments: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class ScriptedModel:
    """An inference worker whose k-th answer in an episode is `script[k]` (its ids under the
    episode's tokenizer, log-prob -0.25 - k/100 each, so turns are told apart); every prompt and
    output is kept."""

    def __init__(self, tokenizer_dir: str, script: list[str]):
        from roll.models.loading import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.script, self.prompts, self.outputs = script, [], []
        self.generate_many = _Method(self._generate_many)
        self.release_sessions = _Method(lambda sessions: None)

    async def _generate_many(self, requests):
        outs = []
        for r in requests:
            k = int(r.request_id.rsplit("/", 1)[1])
            ids = self.tokenizer.encode(self.script[k], add_special_tokens=False) + [self.tokenizer.eos_token_id]
            outs.append(GenerateOutput(r.request_id, ids, [-0.25 - k / 100] * len(ids), "stop", policy_version=3))
            self.prompts.append(list(r.prompt_ids))
        self.outputs += outs
        return outs


class RecordingToolCallRunner(ToolCallRunner):
    """`ToolCallRunner` unchanged, keeping every episode's `EpisodeResult` for the test to read."""

    results: list = []

    def run_job(self, seed):
        result = super().run_job(seed)
        RecordingToolCallRunner.results.append(result)
        return result


ENV_CONFIG = {
    "tasks": ["add"],
    "max_steps": 5,
    "sandbox": {"wall_s": 3, "cpu_s": 2, "max_procs": 16, "output_bytes": 4096},
    "violation_penalty": -0.5,
}


def play(tokenizer_dir, script, max_steps=5, isolation="auto", mode="traj"):
    engine = ScriptedModel(tokenizer_dir, script)
    spec = EnvSpec(
        tag="Code",
        env_type="code_sandbox",
        env_config={**ENV_CONFIG, "max_steps": max_steps, "isolation": isolation},  # graded at its last action
        max_steps=max_steps,
        max_tokens_per_step=512,
        agent_runner_cls=f"{__name__}:RecordingToolCallRunner",
    )
    RecordingToolCallRunner.results.clear()

    async def run():
        sampling = SamplingParams(max_new_tokens=512)
        worker = EnvWorker([spec], 1, tokenizer_dir, engine, sampling, 8192, manager_type=mode)
        try:
            return await worker.run_group(0, GroupSpec(0, "g0", env_seed=7, sample_seed=1))
        finally:
            await worker._proxy.stop()

    result = asyncio.run(run())
    assert result.dropped == []
    (traj,) = result.trajectories
    (episode,) = RecordingToolCallRunner.results
    return traj, episode, engine


def test_the_env_offers_its_actions_as_tools_and_maps_calls_to_them():
    env = CodeSandboxEnv(tasks=["add"])
    assert [t["function"]["name"] for t in env.tool_schemas()] == ["bash", "python", "write", "submit"]
    assert env.tool_call_action("bash", {"command": "ls"}) == "<bash>ls</bash>"
    assert env.tool_call_action("write", {"content": "x = 1\n"}) == "<write>x = 1\n</write>"
    assert env.tool_call_action("submit", {}) == "<answer>submit</answer>"
    # an unknown tool or a missing argument is an invalid action: format penalty, nothing runs
    env.reset(seed=0)
    for name, arguments in [("rm", {"command": "ls"}), ("bash", {}), ("python", {"code": 3})]:
        _, reward, terminated, _, info = env.step(env.tool_call_action(name, arguments))
        assert reward == env.format_penalty and not terminated and not info["action_is_valid"]
    assert info["metrics"]["commands"] == 0.0
    env.close()


def test_the_experts_tool_calls_run_in_the_sandbox_and_earn_the_hidden_tests_reward(tokenizer_dir):
    script = [call("bash", command="cat solution.py; pwd"), call("write", content=ADD.solution), call("submit")]
    traj, episode, engine = play(tokenizer_dir, script)
    assert episode.agent_exit_reason == "submitted" and episode.score == 1.0 and episode.success
    assert traj.step_rewards == [0.0, 0.0, 1.0] and traj.success and traj.stop_reason == "terminated"
    assert traj.metrics["tests_passed"] == 1.0 and traj.metrics["commands"] >= 1.0
    assert traj.metrics["proxy/generations"] == 3.0 and traj.metrics["tool_calls"] == 3.0 and traj.policy_version == 3

    # the tools were shown, and the bash call's output came back as a `tool` message: the
    # starter solution.py, in the sandbox's workspace
    tok = engine.tokenizer
    first, second = (tok.decode(p) for p in engine.prompts[:2])
    assert all(f'"name": "{t["function"]["name"]}"' in first for t in TOOL_SCHEMAS)
    tool_turn = second[len(tok.decode(engine.prompts[0] + engine.outputs[0].token_ids)) :]
    assert tool_turn.startswith(f"\n{IM_START}tool\n") and ADD.starter in tool_turn and "/workspace" in tool_turn

    # trained: exactly the engine's ids under mask 1, its log-probs there, the tool results (and
    # nothing generated) under mask 0; each prompt extends the last prompt and answer
    generated = [t for t, m in zip(traj.token_ids, traj.response_mask, strict=True) if m]
    assert generated == sum((o.token_ids for o in engine.outputs), [])
    masked_logprobs = [p for p, m in zip(traj.infer_logprobs, traj.response_mask, strict=True) if m]
    assert masked_logprobs == sum((o.logprobs for o in engine.outputs), [])
    assert traj.token_ids[: len(engine.prompts[-1])] == engine.prompts[-1]
    assert traj.token_ids == engine.prompts[-1] + engine.outputs[-1].token_ids
    for prompt, out, following in zip(engine.prompts, engine.outputs, engine.prompts[1:], strict=False):
        assert following[: len(prompt) + len(out.token_ids)] == prompt + out.token_ids
    assert sum(traj.response_mask) < len(traj.token_ids) - len(engine.prompts[0])  # tool turns: mask 0
    assert len(traj.turn_end_positions) == 3


def test_step_wise_each_tool_calling_turn_is_a_sample_of_the_engines_prompt_and_ids(tokenizer_dir):
    script = [call("bash", command="ls"), call("write", content=ADD.solution), call("submit")]
    traj, episode, engine = play(tokenizer_dir, script, mode="step")
    assert episode.score == 1.0 and [s.reward for s in traj.steps] == [0.0, 0.0, 1.0]
    assert [s.prompt_ids for s in traj.steps] == engine.prompts
    assert [s.response_ids for s in traj.steps] == [o.token_ids for o in engine.outputs]
    assert [s.logprobs for s in traj.steps] == [o.logprobs for o in engine.outputs]


def test_a_wrong_solution_earns_its_share_of_the_hidden_tests(tokenizer_dir):
    wrong = "def add(a, b):\n    return 3\n"  # passes add(1, 2) == 3 only
    traj, episode, _ = play(tokenizer_dir, [call("write", content=wrong), call("submit")])
    assert episode.score == pytest.approx(1 / 3) and not episode.success and not traj.success
    assert episode.agent_exit_reason == "submitted" and traj.metrics["tests_passed"] == pytest.approx(1 / 3)


def test_an_agent_that_never_submits_is_graded_at_max_steps(tokenizer_dir):
    script = [call("write", content="def add(a, b):\n    return 3\n"), call("python", code="print(6 * 7)")]
    traj, episode, engine = play(tokenizer_dir, script, max_steps=2)
    assert episode.agent_exit_reason == "max_steps" and traj.stop_reason == "truncated"
    assert traj.step_rewards == pytest.approx([0.0, 1 / 3]) and traj.metrics["submitted"] == 0.0
    assert len(engine.prompts) == 2 and traj.metrics["commands"] >= 1.0


MODES = ["namespaces", "rlimits"] if NAMESPACES else ["rlimits"]
ESCAPES = {
    "write_outside": call("bash", command=f"echo pwned > {ESCAPE_FILE}"),
    "output": call("bash", command="yes 0123456789"),
    "wall_time": call("bash", command="sleep 100000"),
    "network": call("python", code="import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"),
}


@pytest.mark.parametrize("isolation", MODES)
@pytest.mark.parametrize("reason", list(ESCAPES))
def test_an_escape_through_a_tool_call_is_contained_and_reported(tokenizer_dir, reason, isolation):
    if reason == "network" and isolation != "namespaces" and seccomp_available():
        pytest.skip(f"rlimits has the network without the seccomp filter ({seccomp_available()}; reported)")
    traj, episode, engine = play(tokenizer_dir, [ESCAPES[reason], call("submit")], isolation=isolation)
    assert episode.agent_exit_reason == f"sandbox violation: {reason}"
    assert traj.step_rewards == [-0.5] and traj.metrics["violations"] == 1.0
    assert traj.metrics["proxy/generations"] == 1.0  # the episode ended at the attempt
    assert traj.metrics["isolation_namespaces"] == float(isolation == "namespaces")
    assert not os.path.exists(ESCAPE_FILE)
    assert sum(traj.response_mask) == len(engine.outputs[0].token_ids)
