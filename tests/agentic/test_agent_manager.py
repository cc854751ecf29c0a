"""Agent loops in the pipeline: dataset rows as envs (`env_type: agent`), picked by env seed, played
by `AgentManager`s inside a real `EnvWorker` (no Ray: a scripted inference worker), and the config
checks that name the key at fault."""

import asyncio
import json
from pathlib import Path

import pytest

from roll.agentic.agent_loop.dataset import AgentDatasetError, check_agent_env_config, load_agent_dataset
from roll.agentic.agent_loop.manager import AgentManager, AgentPool
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.agentic.generation import GenerateTimeout
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.configs.base import ConfigError
from roll.configs.loader import load_config
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.tiny import build_tiny_model, build_tiny_tokenizer
from roll.pipeline.checks.config import check_before_start

REPO = Path(__file__).resolve().parents[2]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'
EXTRA = ["<tool_call>", "</tool_call>", '"name"', '"arguments"', '"calculator"', '"expression"']
CORPUS = ["What is so the answer \\boxed{5} Solve Error unknown tool available", CALL]


def write_dataset(tmp_path: Path, rows, cfg: dict | None = None) -> Path:
    (tmp_path / "cfgs").mkdir(exist_ok=True)
    (tmp_path / "cfgs" / "agent.yaml").write_text(
        json.dumps(
            cfg
            or {
                "tools": ["roll.agentic.agent_loop.calculator:calculator"],
                "reward_fn": "roll.agentic.agent_loop.math_reward:math_reward",
                "max_turns": 3,
            }
        )
    )
    data = tmp_path / "data" / "rows.jsonl"
    data.parent.mkdir(exist_ok=True)
    data.write_text(
        "".join(
            json.dumps({"agent_name": "tool_agent", "agent_cfg_path": "../cfgs/agent.yaml", **r}) + "\n" for r in rows
        )
    )
    return data


ROWS = [{"prompt": f"What is {i} + {5 - i} ?", "answer": "5"} for i in range(7)]  # the scripted answer


class ScriptedInference:
    """Stands in for the inference worker's Ray handle: `generate_many.remote` returns an awaitable.
    Turn 0 calls the calculator, turn 1 answers; records every request. Requests whose id contains
    `fail_on` get no log-probs, which makes their agent raise."""

    def __init__(self, tokenizer, answer="\\boxed{5}", fail_on=None, delay_s=0.0):
        self.tokenizer, self.answer, self.fail_on, self.delay_s = tokenizer, answer, fail_on, delay_s
        self.requests = []
        self.generate_many = self._Remote(self._many)
        self.release_sessions = self._Remote(lambda sids: None)

    class _Remote:
        def __init__(self, fn):
            self.remote = fn

    async def _many(self, requests):
        await asyncio.sleep(self.delay_s)
        return [self._one(r) for r in requests]

    def _one(self, request):
        self.requests.append(request)
        turn = int(request.request_id.rsplit("/", 1)[1])
        text = CALL if turn == 0 else f"so {self.answer}"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        broken = self.fail_on and self.fail_on in request.request_id  # the agent raises on it
        return GenerateOutput(request.request_id, ids, [] if broken else [-0.5] * len(ids), "stop", policy_version=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", corpus=CORPUS, extra_tokens=EXTRA)


def test_rows_are_picked_by_env_seed_and_agent_cfg_paths_resolve_against_the_dataset(tmp_path):
    data = write_dataset(tmp_path, ROWS)
    dataset = load_agent_dataset({"dataset": str(data)})
    cfg_path = str(tmp_path / "cfgs" / "agent.yaml")
    assert (
        dataset.row_for_seed(9)
        == dataset.row_for_seed(9)
        == {**ROWS[9 % 7], "agent_name": "tool_agent", "agent_cfg_path": cfg_path}
    )
    assert {dataset.row_for_seed(s)["prompt"] for s in range(7)} == {r["prompt"] for r in ROWS}
    assert dataset.agents == [("tool_agent", cfg_path)]


@pytest.mark.parametrize(
    ("rows", "cfg", "key", "says"),
    [
        ([{"prompt": "x", "agent_name": "nope"}], None, "dataset", "unknown agent 'nope'"),
        (ROWS, {"max_turnz": 3}, "agent_cfg_path", "unknown config key(s) 'max_turnz'"),
        (ROWS, {"tools": ["roll.agentic.agent_loop.calculator:nope"]}, "agent_cfg_path", "tool 'roll.agentic"),
        (ROWS, {"reward_fn": "roll.agentic.agent_loop.math_reward:nope"}, "agent_cfg_path", "reward_fn"),
    ],
)
def test_bad_rows_and_agent_cfgs_fail_with_the_key(tmp_path, rows, cfg, key, says):
    data = write_dataset(tmp_path, rows, cfg)
    with pytest.raises(AgentDatasetError) as err:
        check_agent_env_config({"dataset": str(data)})
    assert err.value.key == key and says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        (
            "custom_envs.MathTrain.env_config.dataset=/no/such.jsonl",
            "custom_envs.MathTrain.env_config.dataset",
            "does not exist",
        ),
        ("+custom_envs.MathTrain.env_config.rows=3", "custom_envs.MathTrain.env_config.rows", "unknown key"),
        ("train_env_manager.env_manager_type=step", "train_env_manager.env_manager_type", 'needs "traj"'),
        ("+custom_envs.MathVal.response_prefix=x", "custom_envs.MathVal.response_prefix", "not used by env_type"),
    ],
)
def test_config_load_names_the_agent_key(model_dir, override, key, says):
    with pytest.raises(ConfigError) as err:
        check_before_start(
            load_config(str(REPO / "examples" / "math_agent"), "agent_val_math", [f"pretrain={model_dir}", override])
        )
    assert err.value.key == key and says in err.value.message


def test_manager_plays_the_row_with_the_managers_sampling_and_timeout(tmp_path, model_dir):
    tok = build_tiny_tokenizer(CORPUS, EXTRA)
    inference = ScriptedInference(tok)
    spec = EnvSpec("Math", "agent", {"dataset": str(write_dataset(tmp_path, ROWS))}, max_steps=4, max_tokens_per_step=7)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, stop_token_ids=[tok.eos_token_id])
    pool = AgentPool(tok, lambda r: inference._many([r]), sampling, sequence_length=300, generate_timeout_s=5)
    pool.client._generate = _first(inference)
    manager = AgentManager(spec, pool)
    traj = asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", env_seed=7, sample_seed=1)))  # row 0
    assert traj.tag == "Math" and traj.traj_id == "g-0" and traj.env_seed == 7
    assert traj.step_rewards == [0.0, 1.0] and traj.success and traj.metrics["tool_calls"] == 1.0
    first = inference.requests[0]
    assert (first.params.temperature, first.params.top_p, first.params.max_new_tokens) == (0.7, 0.9, 7)
    assert first.params.stop_token_ids == [tok.eos_token_id] and first.session_id == "g-0"
    agent = pool.agent("tool_agent", manager.dataset.rows[0]["agent_cfg_path"], spec)
    assert (agent.cfg.max_turns, agent.cfg.max_total_tokens) == (3, 300)  # the cfg's, then sequence_length
    assert pool.agent("tool_agent", manager.dataset.rows[0]["agent_cfg_path"], spec) is agent  # built once
    pool.client.timeout_s = 0.05
    pool.client._generate = _first(ScriptedInference(tok, delay_s=1.0))
    with pytest.raises(GenerateTimeout):
        asyncio.run(manager.run_episode(EpisodeSpec("g", "g-1", env_seed=7, sample_seed=2)))


def _first(inference):
    async def generate(request):
        return (await inference._many([request]))[0]

    return generate


def test_env_worker_hosts_agent_managers_groups_share_a_row_and_a_crash_drops_one(tmp_path, model_dir):
    data = write_dataset(tmp_path, ROWS)
    tok = build_tiny_tokenizer(CORPUS, EXTRA)
    inference = ScriptedInference(tok, fail_on="g-2/")

    async def play():  # the worker is an async actor: built inside its event loop
        worker = EnvWorker(
            [EnvSpec("Math", "agent", {"dataset": str(data)}, 4, 16)],
            group_size=3,
            tokenizer_path=model_dir,
            inference=inference,
            sampling=SamplingParams(),
            sequence_length=400,
        )
        assert all(isinstance(m, AgentManager) for m in worker.groups[0])
        return await worker.run_group(0, GroupSpec(0, "g", env_seed=3, sample_seed=5))

    result = asyncio.run(play())
    assert [t.traj_id for t in result.trajectories] == ["g-0", "g-1"]
    assert len(result.dropped) == 1 and result.dropped[0].startswith("Math g-2: ValueError: g-2/0: ")
    prompts = {tuple(r.prompt_ids) for r in inference.requests if r.request_id.endswith("/0")}
    assert len(prompts) == 1  # every member got the question of env seed 3
    assert all(t.success and t.rollout_s > 0 for t in result.trajectories)
    seeds = {r.seed for r in inference.requests if r.request_id.endswith("/0")}
    assert len(seeds) == 3  # members differ by sampling seed
