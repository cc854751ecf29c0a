"""LangGraph agents driven by a scripted model: the trajectory holds exactly the prompt, the ids
the engine generated and the continuation ids of the tool results (never re-rendered history),
ToolNode runs the parsed calls, malformed calls are penalised and reported, and a graph that
rewrites history gets a fresh ledger that is counted."""

import asyncio
import copy

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402

from roll.agentic.agent_loop.base import continuation_ids, encode  # noqa: E402
from roll.agentic.agent_loop.langchain_model import RollChatModel, prompt_ids_with_tools  # noqa: E402
from roll.agentic.agent_loop.math_graph import (  # noqa: E402
    MathGraphAgent,
    boxed_answer_reward,
    calculator,
)
from roll.agentic.agent_loop.registry import get_agent_class  # noqa: E402
from roll.core.seeding import derive_seed  # noqa: E402
from roll.models.tiny import build_tiny_tokenizer  # noqa: E402
from tests.agentic.test_tool_agent import QWEN_LIKE_TEMPLATE, ScriptedModel, contains, segments  # noqa: E402

QUOTED = ['"name"', '"arguments"', '"calculator"', '"expression"', '"nope"']
CORPUS = [
    "the answer is calculator Error unknown tool available none not arithmetic Please fix your "
    "mistakes Solve problem Use for Put final in invalid JSON think nope"
]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "1 + 2 * 3"}}</tool_call>'
ANSWER = "the answer is \\boxed{ 7 }"


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
            "\\boxed{",
            *QUOTED,
        ],
    )


def play(tokenizer, texts, **cfg):
    model = ScriptedModel(tokenizer, texts)
    agent = MathGraphAgent(cfg, model, tokenizer)
    row = {"prompt": "the answer is", "answer": 7, "traj_id": "g0", "sample_seed": 5}
    return asyncio.run(agent.run(**row)), model


def first_prompt(tokenizer):
    messages = [
        {"role": "system", "content": MathGraphAgent.defaults["system_prompt"]},
        {"role": "user", "content": "the answer is"},
    ]
    schemas = [RollChatModel(generate_fn=None, tokenizer=tokenizer).bind_tools([calculator]).kwargs["tools"][0]]
    return prompt_ids_with_tools(tokenizer, messages, schemas)


def test_tool_turn_through_the_graph_keeps_exact_ids(tokenizer):
    traj, model = play(tokenizer, [CALL, ANSWER])
    prompt, g0, g1 = first_prompt(tokenizer), model.ids(0), model.ids(1)
    assert model.requests[0].prompt_ids == prompt
    assert "calculator" in tokenizer.decode(prompt)  # schemas in the system message (template ignores tools=)
    # ToolNode ran the calculator on the parsed call; its result follows turn 0 as continuation ids
    result = [{"role": "tool", "name": "calculator", "content": "7"}]
    out0 = type("Out", (), {"finish_reason": "stop", "token_ids": g0})()
    delta = continuation_ids(tokenizer, result, out0)
    assert delta == encode(tokenizer, "\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n")
    assert segments(traj) == [(0, prompt), (1, g0), (0, delta), (1, g1)]
    assert model.requests[1].prompt_ids == prompt + g0 + delta  # each request extends the last
    assert [(r.request_id, r.session_id, r.seed) for r in model.requests] == [
        ("g0/0", "g0", derive_seed(5, 0)),
        ("g0/1", "g0", derive_seed(5, 1)),
    ]
    generated = [lp for lp, m in zip(traj.infer_logprobs, traj.response_mask) if m]
    assert generated == [-1 - i / 100 for i in range(len(g0))] + [-2 - i / 100 for i in range(len(g1))]
    n0 = len(prompt) + len(g0)
    assert traj.turn_end_positions == [n0 - 1, n0 + len(delta) + len(g1) - 1]
    assert (traj.step_rewards, traj.success, traj.stop_reason) == ([0.0, 1.0], True, "terminated")
    assert (traj.num_actions, traj.num_valid_actions, traj.policy_versions) == (2, 2, [3, 3])
    assert traj.metrics == {
        "tool_calls": 1.0,
        "malformed_tool_calls": 0.0,
        "tool_errors": 0.0,
        "retemplated_turns": 0.0,
        "dropped_turns": 0.0,
    }


def test_rewriting_template_cannot_change_generated_ids(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN_LIKE_TEMPLATE  # drops <think> of earlier turns when re-rendered
    traj, model = play(tok, ["<think> think </think>" + CALL, "<think> think </think>" + ANSWER])
    g0, g1 = model.ids(0), model.ids(1)
    delta = encode(tok, "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    prompt = model.requests[0].prompt_ids
    assert segments(traj) == [(0, prompt), (1, g0), (0, delta), (1, g1)]
    assert tok.convert_tokens_to_ids("<think>") in traj.token_ids[len(prompt) : len(prompt) + len(g0)]
    assert traj.success and traj.metrics["retemplated_turns"] == 0


def test_malformed_calls_are_penalised_reported_and_never_raise(tokenizer):
    texts = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>' + CALL,
        '<tool_call>{"name": "calculator", "arguments": {"expression": "the"}}</tool_call>',
        ANSWER,
    ]
    traj, model = play(tokenizer, texts, format_penalty=-0.5)
    assert traj.step_rewards == [-0.5, -0.5, 0.0, 1.0]
    assert (traj.num_actions, traj.num_valid_actions, traj.stop_reason) == (4, 2, "terminated")
    assert traj.metrics["tool_calls"] == 4 and traj.metrics["malformed_tool_calls"] == 2
    assert traj.metrics["tool_errors"] == 1  # the calculator refused "the"; ToolNode reported it
    seen = [model.requests[k].prompt_ids[len(model.requests[k - 1].prompt_ids) :] for k in (1, 2, 3)]
    assert contains(seen[0], encode(tokenizer, "<|im_start|>tool\nError: invalid JSON in <tool_call>"))
    assert contains(seen[1], encode(tokenizer, "<|im_start|>tool\nError: unknown tool 'nope'; available: calculator"))
    assert contains(seen[1], encode(tokenizer, "<|im_start|>tool\n7<|im_end|>"))  # the valid call ran too
    assert contains(seen[2], encode(tokenizer, "<|im_start|>tool\nError:"))  # ToolNode's error template
    assert contains(seen[2], encode(tokenizer, "unsupported element Name"))
    # every request still extends the previous one: the ledger was never re-rendered
    for prev, nxt in zip(model.requests, model.requests[1:]):
        assert nxt.prompt_ids[: len(prev.prompt_ids)] == prev.prompt_ids


def test_max_turns_stops_without_appending_results(tokenizer):
    traj, model = play(tokenizer, [CALL] * 5, max_turns=2)
    assert (traj.stop_reason, traj.num_actions, len(model.requests)) == ("max_steps", 2, 2)
    assert traj.token_ids[-len(model.ids(1)) :] == model.ids(1) and traj.response_mask[-1] == 1
    assert traj.step_rewards == [0.0, 0.0] and not traj.success


def test_total_token_budget_caps_generation_and_stops(tokenizer):
    _, free = play(tokenizer, [CALL, ANSWER])
    second_prompt = len(free.requests[1].prompt_ids)
    traj, model = play(tokenizer, [CALL, ANSWER], max_total_tokens=second_prompt + 2)
    assert model.requests[1].params.max_new_tokens == 2 and len(traj.token_ids) == second_prompt + 2
    assert (traj.stop_reason, traj.step_rewards) == ("truncated", [0.0, 0.0])
    traj, model = play(tokenizer, [CALL, ANSWER], max_total_tokens=second_prompt)  # no room after the result
    assert (traj.stop_reason, traj.num_actions, len(model.requests)) == ("max_tokens", 1, 1)
    assert traj.token_ids == free.requests[1].prompt_ids[: len(traj.token_ids)] and traj.response_mask[-1] == 1
    traj, model = play(tokenizer, [CALL, ANSWER], max_total_tokens=5)  # the prompt alone is too long
    assert (traj.stop_reason, traj.num_actions, traj.step_rewards, model.requests) == ("max_tokens", 0, [], [])


def test_history_divergence_gets_a_fresh_ledger_and_is_counted(tokenizer):
    model = ScriptedModel(tokenizer, [CALL, ANSWER, ANSWER])

    async def generate(turn, prompt_ids, max_new_tokens):
        agent = MathGraphAgent({}, model, tokenizer)
        return await agent.generate(agent.episode({"traj_id": "d"}), turn, prompt_ids, max_new_tokens)

    async def main():
        llm = RollChatModel(generate_fn=generate, tokenizer=tokenizer).bind_tools([calculator])
        start = [SystemMessage("s"), HumanMessage("the answer is")]
        first = await llm.ainvoke(start)
        assert first.tool_calls[0]["args"] == {"expression": " 1 + 2 * 3 "}
        meta = first.response_metadata
        assert (meta["token_ids"], meta["prompt_ids"], meta["turn"]) == (model.ids(0), model.requests[0].prompt_ids, 0)
        result = ToolMessage("7", tool_call_id=first.tool_calls[0]["id"], name="calculator")
        second = await llm.ainvoke(start + [first, result])  # continued: same conversation
        edited = AIMessage("the answer is", tool_calls=first.tool_calls)  # the graph rewrote turn 0
        third = await llm.ainvoke(start + [edited, result])
        return llm.bound, first, second, third

    chat, first, second, third = asyncio.run(main())
    assert second.response_metadata["conversation"] == 0 and third.response_metadata["conversation"] == 1
    assert chat.metrics() == {"retemplated_turns": 1.0, "conversations": 2.0, "generated_turns": 3.0}
    main_ledger = chat.conversation(0).ledger
    assert model.requests[1].prompt_ids[: len(model.requests[0].prompt_ids) + len(model.ids(0))] == model.requests[
        0
    ].prompt_ids + model.ids(0)
    assert main_ledger.num_turns == 2 and chat.conversation(1).ledger.num_turns == 1
    assert model.requests[2].prompt_ids[: len(model.requests[1].prompt_ids)] != model.requests[1].prompt_ids


def test_calculator_is_arithmetic_only():
    # exact arithmetic (roll.agentic.agent_loop.calculator): 7 / 2 is the fraction 7/2
    assert [calculator(e) for e in ["1 + 2 * 3", "(2 + 3) * 4", "7 / 2", "-2 ** 2", "9 // 2 % 3"]] == [
        "7",
        "20",
        "7/2",
        "-4",
        "1",
    ]
    for bad in ["__import__('os')", "x + 1", "(1).real", "2 ** 100", "9 ** 9 ** 9", "1 / 0", "[1]", "1 +", "2 ** 0.5"]:
        with pytest.raises(ValueError):
            calculator(bad)


def test_boxed_reward_and_registration():
    assert boxed_answer_reward({"answer": 7}, "so \\boxed{ 7 }") == 1.0
    assert boxed_answer_reward({"answer": 7}, "\\boxed{8} then 7") == 0.0
    assert boxed_answer_reward({"answer": "7.0"}, "it is 7") == 1.0
    assert get_agent_class("math_graph") is MathGraphAgent
    with pytest.raises(ValueError, match="unknown config key"):
        MathGraphAgent({"max_turn": 2}, None, None)
