"""Agent registry, YAML agent configs, and the built-in single_turn agent."""

import asyncio

import pytest
from omegaconf import DictConfig

from roll.agentic.agent_loop import AgentLoop, SingleTurnAgent, ToolAgent, registry
from roll.agentic.agent_loop.base import encode, render_text
from roll.core.records import GenerateOutput
from roll.models.tiny import build_tiny_tokenizer


@pytest.fixture(autouse=True)
def private_registry(monkeypatch):
    """Agents registered by a test do not leak into the others."""
    monkeypatch.setattr(registry, "_AGENTS", dict(registry._AGENTS))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(corpus=["what is one plus two the answer"])


class EchoModel:
    """Answers every request with fixed ids and log-probs."""

    def __init__(self, ids, finish="stop"):
        self.ids, self.finish, self.requests = list(ids), finish, []

    async def generate(self, request):
        self.requests.append(request)
        ids = self.ids[: request.params.max_new_tokens]
        return GenerateOutput(request.request_id, ids, [-0.25] * len(ids), self.finish, policy_version=5)


def exact_answer(row, text):
    return 1.0 if text == f"<answer> {row['answer']} </answer>" else 0.0


def test_builtins_are_registered():
    assert {"single_turn", "tool_agent"} <= set(registry.list_agents())
    assert registry.get_agent_class("single_turn") is SingleTurnAgent
    assert registry.get_agent_class("tool_agent") is ToolAgent


def test_register_rejects_a_taken_name_but_not_the_same_class_twice():
    @registry.register("mine")
    class Mine(AgentLoop):
        pass

    assert registry.register("mine")(Mine) is Mine and Mine.agent_name == "mine"
    with pytest.raises(ValueError, match="agent name 'mine' is already registered by .*Mine"):

        @registry.register("mine")
        class Other(AgentLoop):
            pass


def test_unknown_agent_is_one_line_listing_known_names():
    with pytest.raises(ValueError) as err:
        registry.get_agent_class("tool_agnet")
    message = str(err.value)
    assert "\n" not in message and "unknown agent 'tool_agnet'" in message
    assert "single_turn" in message and "tool_agent" in message


def test_agent_class_by_import_path():
    assert registry.get_agent_class("roll.agentic.agent_loop.tool_agent:ToolAgent") is ToolAgent
    with pytest.raises(ValueError, match="no module 'no_such_pkg.agents'"):
        registry.get_agent_class("no_such_pkg.agents:Agent")
    with pytest.raises(ValueError, match="has no 'Nope'"):
        registry.get_agent_class("roll.agentic.agent_loop.tool_agent:Nope")


def test_load_agent_cfg(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("max_turns: 3\ntool_timeout_s: 2.5\nmax_tokens_per_turn: ${max_turns}\n")
    cfg = registry.load_agent_cfg(path)
    assert isinstance(cfg, DictConfig) and (cfg.max_turns, cfg.tool_timeout_s, cfg.max_tokens_per_turn) == (3, 2.5, 3)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match=f"agent config '{missing}' does not exist"):
        registry.load_agent_cfg(missing)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="is not a mapping"):
        registry.load_agent_cfg(tmp_path / "list.yaml")


def test_make_agent_from_yaml_fills_defaults_and_rejects_typos(tmp_path, tokenizer):
    path = tmp_path / "agent.yaml"
    path.write_text("max_turns: 3\ntools: ['os.path:basename']\n")
    agent = registry.make_agent("tool_agent", path, EchoModel([]), tokenizer)
    assert (agent.cfg.max_turns, agent.cfg.tool_timeout_s) == (3, 30.0) and list(agent.tools) == ["basename"]
    path.write_text("max_turn: 3\n")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) 'max_turn' for agent 'tool_agent'; accepted: "):
        registry.make_agent("tool_agent", path, EchoModel([]), tokenizer)


def test_single_turn_agent_trajectory_and_row_passthrough(tokenizer):
    answer = encode(tokenizer, "<answer> 3 </answer>") + [tokenizer.eos_token_id]
    model = EchoModel(answer)
    seen = {}

    def reward(row, text):
        seen.update(row)
        return exact_answer(row, text)

    agent = SingleTurnAgent({"reward_fn": reward, "system_prompt": "the answer", "temperature": 0.5}, model, tokenizer)
    traj = asyncio.run(
        agent.run(
            prompt="what is one plus two",
            answer=3,
            source="gsm",
            traj_id="q1",
            traj_group_id="g1",
            tag="math",
            env_seed=4,
            sample_seed=9,
        )
    )
    prompt = encode(
        tokenizer,
        render_text(
            tokenizer,
            [{"role": "system", "content": "the answer"}, {"role": "user", "content": "what is one plus two"}],
            True,
        ),
    )
    assert model.requests[0].prompt_ids == prompt and model.requests[0].params.temperature == 0.5
    assert traj.token_ids == prompt + answer
    assert traj.response_mask == [0] * len(prompt) + [1] * len(answer)
    assert traj.infer_logprobs == [0.0] * len(prompt) + [-0.25] * len(answer)
    assert traj.turn_end_positions == [len(traj.token_ids) - 1]
    assert (traj.step_rewards, traj.success, traj.stop_reason, traj.num_actions) == ([1.0], True, "terminated", 1)
    ids = (traj.tag, traj.traj_group_id, traj.traj_id, traj.env_seed, traj.policy_versions)
    assert ids == ("math", "g1", "q1", 4, [5])
    assert seen["source"] == "gsm" and seen["answer"] == 3  # extra row fields reach the reward fn


def test_reward_fn_from_the_row_or_an_import_path_and_none_is_an_error(tokenizer):
    answer = encode(tokenizer, "<answer> 3 </answer>")
    # any importable two-argument callable: operator.is_not(row, text) is True -> reward 1.0
    agent = SingleTurnAgent({"reward_fn": "operator:is_not"}, EchoModel(answer, finish="length"), tokenizer)
    assert asyncio.run(agent.run(prompt="what", traj_id="a")).step_rewards == [1.0]
    traj = asyncio.run(agent.run(prompt="what", answer=3, traj_id="b", reward_fn=exact_answer))
    assert (traj.step_rewards, traj.stop_reason) == ([1.0], "truncated")
    bare = SingleTurnAgent({}, EchoModel(answer), tokenizer)
    with pytest.raises(ValueError, match="no reward_fn"):
        asyncio.run(bare.run(prompt="what", traj_id="c"))
    with pytest.raises(ValueError, match="neither 'prompt' nor 'messages'"):
        asyncio.run(bare.run(traj_id="d"))
