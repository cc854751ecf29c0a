"""The tool agent driven by a scripted model: exact token ids, masks, log-probs and rewards
across tool turns, with the tiny model's append-only template and with a Qwen3-like template that
rewrites earlier assistant turns."""

import asyncio
import copy
import json

import pytest

from roll.agentic.agent_loop import ToolAgent
from roll.agentic.agent_loop.base import continuation_ids, encode, render_text
from roll.agentic.agent_loop.tool_agent import TOOLS_SYSTEM_PROMPT
from roll.core.records import GenerateOutput
from roll.core.seeding import derive_seed
from roll.models.tiny import build_tiny_tokenizer

QUOTED = [
    '"name"',
    '"arguments"',
    '"add"',
    '"a"',
    '"b"',
    '"weather"',
    '"city"',
    '"paris"',
    '"slow"',
    '"boom"',
    '"nope"',
    '"ping"',
    '"pong"',
]
CORPUS = [
    "the answer is sunny need both done Error timed out after raised RuntimeError disk on fire",
    "invalid unknown tool available tool_response think Tools boom slow",
]
# Qwen3-like: tool schemas in the system turn, tool results grouped into one user turn, and the
# <think> block of every assistant turn but the last dropped (so the template is not append-only).
# (HF renders with trim_blocks: a newline right after a block tag is dropped, hence {{ '\\n' }}.)
QWEN_LIKE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}"
    "# Tools\n{% for tool in tools %}{{ tool['function'] | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{% set content = message['content'] %}"
    "{% if not loop.last and '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "<|im_start|>assistant\n{{ content }}<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif message['role'] != 'system' %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ADD_CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
WEATHER_CALL = '<tool_call>{"name": "weather", "arguments": {"city": "paris"}}</tool_call>'


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def weather(city: str) -> str:
    """Today's weather in a city."""
    return "sunny"


def answer_reward(row, text):
    return 1.0 if f"<answer> {row['answer']} </answer>" in text else 0.0


class ScriptedModel:
    """Answers the k-th request with the k-th text as tiny-tokenizer ids plus eos ("stop"), cut to
    the request's max_new_tokens ("length"); token i of answer k has log-prob -(k+1) - i/100."""

    def __init__(self, tokenizer, texts, policy_version=3):
        self.tokenizer, self.texts, self.version, self.requests = tokenizer, list(texts), policy_version, []

    def ids(self, k):
        return encode(self.tokenizer, self.texts[k]) + [self.tokenizer.eos_token_id]

    async def generate(self, request):
        k = len(self.requests)
        self.requests.append(request)
        full = self.ids(k)
        ids = full[: request.params.max_new_tokens]
        return GenerateOutput(
            request.request_id,
            ids,
            [-(k + 1) - i / 100 for i in range(len(ids))],
            "stop" if ids == full else "length",
            self.version,
        )


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(
        corpus=CORPUS,
        extra_tokens=[
            "<tool_call>",
            "</tool_call>",
            "<think>",
            "</think>",
            "<tool_response>",
            "</tool_response>",
            *QUOTED,
        ],
    )


@pytest.fixture(scope="module")
def qwen_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN_LIKE_TEMPLATE
    return tok


def play(tokenizer, texts, row=None, **cfg):
    model = ScriptedModel(tokenizer, texts)
    agent = ToolAgent({"tools": [add, weather], "reward_fn": answer_reward, **cfg}, model, tokenizer)
    row = row or {"prompt": "the answer is", "answer": 3, "traj_id": "t0", "sample_seed": 11}
    return asyncio.run(agent.run(**row)), model, agent


def contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def segments(traj):
    """(mask, ids) runs of the trajectory."""
    runs = []
    for tok, m in zip(traj.token_ids, traj.response_mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tok)
        else:
            runs.append((m, [tok]))
    return runs


def test_append_only_template_matches_one_rendering_of_the_whole_chat(tokenizer):
    texts = [ADD_CALL, "<answer> 3 </answer>"]
    traj, model, agent = play(tokenizer, texts)
    # the tiny template ignores tools=: the schemas go to the system message
    schemas = "\n".join(json.dumps(s["function"]) for s in agent.schemas)
    assert schemas.startswith(
        '{"name": "add", "description": "Add two integers.", '
        '"parameters": {"additionalProperties": false, "properties": {"a"'
    )
    system = TOOLS_SYSTEM_PROMPT.format(schemas=schemas)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "the answer is"}]
    prompt = encode(tokenizer, render_text(tokenizer, messages, True))
    assert model.requests[0].prompt_ids == prompt
    # oracle: the whole conversation rendered once (the template is append-only)
    messages += [
        {"role": "assistant", "content": texts[0]},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": texts[1]},
    ]
    whole = encode(tokenizer, render_text(tokenizer, messages, False))
    assert traj.token_ids == whole[:-1] and tokenizer.decode(whole[-1:]) == "\n"
    g0, g1 = model.ids(0), model.ids(1)
    delta = encode(tokenizer, "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n")
    assert segments(traj) == [(0, prompt), (1, g0), (0, delta), (1, g1)]
    assert model.requests[1].prompt_ids == prompt + g0 + delta  # every turn extends the last one
    assert [(r.request_id, r.session_id, r.seed) for r in model.requests] == [
        ("t0/0", "t0", derive_seed(11, 0)),
        ("t0/1", "t0", derive_seed(11, 1)),
    ]
    gen_logprobs = [lp for lp, m in zip(traj.infer_logprobs, traj.response_mask) if m]
    assert gen_logprobs == [-1 - i / 100 for i in range(len(g0))] + [-2 - i / 100 for i in range(len(g1))]
    assert all(lp == 0.0 for lp, m in zip(traj.infer_logprobs, traj.response_mask) if not m)
    n0 = len(prompt) + len(g0)
    assert traj.turn_end_positions == [n0 - 1, n0 + len(delta) + len(g1) - 1]
    assert (traj.step_rewards, traj.success, traj.stop_reason) == ([0.0, 1.0], True, "terminated")
    assert (traj.num_actions, traj.num_valid_actions, traj.policy_versions) == (2, 2, [3, 3])
    assert traj.metrics == {"tool_calls": 1.0, "malformed_tool_calls": 0.0, "tool_errors": 0.0, "tool_timeouts": 0.0}


def test_rewriting_template_keeps_generated_ids_exactly(qwen_tokenizer):
    tok = qwen_tokenizer
    texts = ["<think> need both </think>" + ADD_CALL + WEATHER_CALL, "<think> done </think> <answer> 3 </answer>"]
    traj, model, agent = play(tok, texts)
    messages = [{"role": "user", "content": "the answer is"}]
    prompt = encode(tok, render_text(tok, messages, True, tools=agent.schemas))
    assert contains(prompt, encode(tok, "# Tools"))  # the template takes tools=: no system-message fallback
    g0, g1 = model.ids(0), model.ids(1)
    delta = encode(
        tok,
        "\n<|im_start|>user\n<tool_response>\n3\n</tool_response>"
        "\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    assert segments(traj) == [(0, prompt), (1, g0), (0, delta), (1, g1)]
    assert model.requests[1].prompt_ids == prompt + g0 + delta
    # re-rendering the history would drop turn 0's <think> block: the policy's ids would be lost
    history = messages + [
        {"role": "assistant", "content": texts[0]},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "sunny"},
    ]
    rerendered = encode(tok, render_text(tok, history, True, tools=agent.schemas))
    assert rerendered != prompt + g0 + delta
    assert tok.convert_tokens_to_ids("<think>") in g0 and rerendered.count(tok.convert_tokens_to_ids("<think>")) == 0
    assert (traj.step_rewards, traj.stop_reason, traj.metrics["tool_calls"]) == ([0.0, 1.0], "terminated", 2.0)


def test_continuation_closes_a_turn_cut_by_length(tokenizer):
    tool = [{"role": "tool", "content": "3"}]
    closed = GenerateOutput("r", [5, tokenizer.eos_token_id], [0.0, 0.0], "stop", 0)
    cut = GenerateOutput("r", [5, 6], [0.0, 0.0], "length", 0)
    after_eos = encode(tokenizer, "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n")
    assert continuation_ids(tokenizer, tool, closed) == after_eos
    assert continuation_ids(tokenizer, tool, cut) == [tokenizer.eos_token_id] + after_eos


def test_malformed_calls_timeouts_and_errors_are_penalised_never_raised(tokenizer):
    async def slow() -> str:
        await asyncio.sleep(30)
        return "late"

    def boom() -> str:
        raise RuntimeError("disk on fire")

    texts = [
        '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "slow", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "boom", "arguments": {}}</tool_call>' + ADD_CALL,
        "<answer> 3 </answer>",
    ]
    model = ScriptedModel(tokenizer, texts)
    agent = ToolAgent(
        {"tools": [add, slow, boom], "reward_fn": answer_reward, "tool_timeout_s": 0.05, "format_penalty": -0.5},
        model,
        tokenizer,
    )
    traj = asyncio.run(agent.run(prompt="the answer is", answer=3, traj_id="t1"))
    assert traj.metrics == {"tool_calls": 5.0, "malformed_tool_calls": 2.0, "tool_errors": 1.0, "tool_timeouts": 1.0}
    assert traj.step_rewards == [-0.5, 0.0, 0.0, 1.0]
    assert (traj.num_actions, traj.num_valid_actions, traj.stop_reason) == (4, 3, "terminated")
    shown = model.requests[3].prompt_ids[len(model.requests[2].prompt_ids) :]  # results of turn 2
    error = "<|im_start|>tool\nError: boom raised RuntimeError: disk on fire<|im_end|>"
    assert contains(shown, encode(tokenizer, error))
    assert contains(shown, encode(tokenizer, "<|im_start|>tool\n3<|im_end|>"))
    assert contains(model.requests[2].prompt_ids, encode(tokenizer, "Error: slow timed out after 0.05s"))


def test_parallel_calls_of_one_turn_run_concurrently(tokenizer):
    events = {}

    async def ping() -> str:  # waits for pong to have started: deadlocks if calls run in turn
        events["ping"].set()
        await events["pong"].wait()
        return "done"

    async def pong() -> str:
        events["pong"].set()
        await events["ping"].wait()
        return "done"

    async def main():
        events.update(ping=asyncio.Event(), pong=asyncio.Event())
        texts = [
            '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "pong", "arguments": {}}</tool_call>',
            "<answer> 3 </answer>",
        ]
        agent = ToolAgent(
            {"tools": [ping, pong], "reward_fn": answer_reward, "tool_timeout_s": 5},
            ScriptedModel(tokenizer, texts),
            tokenizer,
        )
        return await agent.run(prompt="the answer is", answer=3, traj_id="t2")

    traj = asyncio.run(main())
    assert traj.metrics["tool_timeouts"] == 0 and traj.metrics["tool_calls"] == 2 and traj.success


def test_max_turns_stops_a_model_that_keeps_calling_tools(tokenizer):
    traj, model, _ = play(tokenizer, [ADD_CALL] * 5, max_turns=2)
    assert (traj.stop_reason, traj.num_actions, len(model.requests)) == ("max_steps", 2, 2)
    assert traj.response_mask[-1] == 1 and traj.token_ids[-len(model.ids(1)) :] == model.ids(1)  # no results appended
    assert traj.step_rewards == [0.0, 0.0] and not traj.success  # reward fn saw no answer ("")


def test_total_token_budget_caps_generation_and_stops(tokenizer):
    texts = [ADD_CALL, "<answer> 3 </answer>"]
    _, free, _ = play(tokenizer, texts)
    second_prompt = len(free.requests[1].prompt_ids)
    # room for 2 tokens of the second turn: the request is capped and the answer cut
    traj, model, _ = play(tokenizer, texts, max_total_tokens=second_prompt + 2)
    assert model.requests[1].params.max_new_tokens == 2 and len(traj.token_ids) == second_prompt + 2
    assert (traj.stop_reason, traj.step_rewards) == ("truncated", [0.0, 0.0])
    # no room to generate after the tool results of turn 0: they are not appended
    traj, model, _ = play(tokenizer, texts, max_total_tokens=second_prompt)
    assert (traj.stop_reason, traj.num_actions, len(model.requests)) == ("max_tokens", 1, 1)
    assert traj.token_ids == free.requests[1].prompt_ids[: len(traj.token_ids)] and traj.response_mask[-1] == 1
    # a prompt longer than the budget: no turn at all
    traj, model, _ = play(tokenizer, texts, max_total_tokens=5)
    assert (traj.stop_reason, traj.num_actions, traj.step_rewards, model.requests) == ("max_tokens", 0, [], [])


def test_per_turn_token_limit(tokenizer):
    traj, model, _ = play(tokenizer, ["<answer> 3 </answer>"], max_tokens_per_turn=2)
    assert model.requests[0].params.max_new_tokens == 2 and sum(traj.response_mask) == 2
    assert traj.stop_reason == "truncated"


def test_unknown_config_key_is_rejected(tokenizer):
    with pytest.raises(ValueError, match=r"unknown config key\(s\) 'max_turn' for agent 'tool_agent'"):
        ToolAgent({"max_turn": 3}, ScriptedModel(tokenizer, []), tokenizer)
