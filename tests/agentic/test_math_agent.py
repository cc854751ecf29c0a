"""The math agent's parts: the ast calculator (exact, and nothing but arithmetic), the math-verify
reward (equivalent forms, never raises), the MATH preprocessing, the shipped sample set, and the
tiny `math` preset's tokenizer."""

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from roll.agentic.agent_loop.calculator import calculator
from roll.agentic.agent_loop.math_reward import last_boxed, math_reward

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "math_agent"


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(3 + 4) * 12 / 7", "12"),
        ("1/3 + 1/6", "1/2"),
        ("2 ** 10 - 1", "1023"),
        ("-7 // 2", "-4"),
        ("17 % 5", "2"),
        ("0.1 + 0.2", "3/10"),
        ("3 ^ 2", "9"),
        (" 2 + 3 ", "5"),
        ("2 ** -2", "1/4"),
        ("1 2 . 5 * * 2 - 7 / / 2", "613/4"),  # as the tiny tokenizer decodes
    ],
)
def test_calculator_is_exact(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("__import__('os').system('echo hi')", "unsupported element Call"),
        ("x + 1", "unsupported element Name"),
        ("(1).__class__", "unsupported element Attribute"),
        ("9 ** 9 ** 9", "exponents"),
        ("1 / 0", "division by zero"),
        ("2 +", "not an arithmetic expression"),
        ("True + 1", "unsupported element Constant"),
        ("'a' * 3", "unsupported element Constant"),
        ("10 ** 60 * 10 ** 60", "more than 100 digits"),
    ],
)
def test_calculator_refuses_everything_else_in_one_line(expression, says):
    result = calculator(expression)
    assert result.startswith("Error: ") and says in result and "\n" not in result


HOSTILE = [
    "(((1/10**64)**64)**64)**64",
    "((((1/10**64)**64)**64)**64)**64",  # once 13 s, then unbounded memory
    "(((7/3)**64)**64)**64",
    "(1-2**-60)**64**2",
    "10**10**10",
    "2**2**2**2**2",
    "(10**99)**2",
    "*".join(["99999999999"] * 16),
    "9" * 150,
    "1" + "0" * 199,
    "0." + "0" * 150 + "1",
    "1e308*1e308",
    "1e999",
    "-(" * 90 + "1" + ")" * 90,
    "(" * 300 + "1" + ")" * 300,
    "9" * 100_000,
]


@pytest.mark.parametrize("expression", HOSTILE)
def test_calculator_refuses_huge_work_up_front(expression):
    """Model-written input that would take seconds, gigabytes or hours: one-line error (or a small
    exact answer) in milliseconds, so the tool never needs its timeout."""
    started = time.perf_counter()
    result = calculator(expression)
    assert time.perf_counter() - started < 0.05
    assert "\n" not in result and len(result) <= 220


def test_a_hostile_calculation_does_not_block_the_agents_event_loop():
    """Through the tool runner, as an agent calls it: a ticker on the same loop keeps ticking."""
    from roll.agentic.agent_loop.tools import ToolCall, run_tool_calls

    async def play():
        gaps, last, done = [], time.perf_counter(), False

        async def tick():
            nonlocal last
            while not done:
                await asyncio.sleep(0.005)
                gaps.append(time.perf_counter() - last)
                last = time.perf_counter()

        ticker = asyncio.ensure_future(tick())
        calls = [ToolCall("calculator", {"expression": e}) for e in HOSTILE[:4]]
        results = await run_tool_calls(calls, [calculator], timeout_s=2.0)
        done = True
        await ticker
        return results, max(gaps, default=0.0)

    results, worst_gap = asyncio.run(play())
    assert [r.status for r in results] == ["ok"] * 4 and worst_gap < 0.5
    assert [r.content for r in results] == ["Error: result has more than 100 digits"] * 3 + [
        "Error: exponents must be integers of at most 64"
    ]


@pytest.mark.parametrize(
    ("answer", "response", "reward"),
    [
        ("\\frac{1}{2}", "so the answer is \\boxed{0.5}", 1.0),
        ("\\frac{2}{3}", "\\ boxed { \\ frac { 2 } { 3 } }", 1.0),  # as the tiny tokenizer decodes it
        ("150", "\\boxed{1 5 0}", 1.0),
        ("150", "\\boxed{151}", 0.0),
        ("-5", "x = \\boxed{-5}", 1.0),
        ("7", "", 0.0),
        ("7", "}{\\frac{{{", 0.0),
        ("", "\\boxed{7}", 0.0),
    ],
)
def test_math_reward(answer, response, reward):
    assert math_reward({"answer": answer}, response) == reward


def test_math_reward_works_off_the_main_thread():  # agents run in an actor's event-loop thread
    out = []
    thread = threading.Thread(target=lambda: out.append(math_reward({"answer": "12"}, "\\boxed{12}")))
    thread.start()
    thread.join()
    assert out == [1.0] and math_reward({}, "\\boxed{1}") == 0.0


def test_last_boxed_balances_braces():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None


def test_preprocess_turns_math_rows_into_agent_rows(tmp_path):
    src = tmp_path / "math.jsonl"
    src.write_text(
        json.dumps(
            {"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1", "type": "Algebra"}
        )
        + "\n"
        + json.dumps({"problem": "p", "solution": "none"})
        + "\n"
    )
    out = tmp_path / "sub" / "rows.jsonl"
    out.parent.mkdir()
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "preprocess.py"), str(src), "--output", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 rows (1 without a boxed answer skipped)" in proc.stdout
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["answer"] == "2" and row["prompt"].startswith("What is $1+1$?\n") and row["type"] == "Algebra"
    assert row["agent_name"] == "tool_agent"
    assert (out.parent / row["agent_cfg_path"]).resolve() == EXAMPLE / "tool_agent.yaml"


def test_shipped_sample_set_is_what_the_script_makes_and_is_solvable(tmp_path):
    from roll.agentic.agent_loop.dataset import check_agent_env_config

    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_sample_data.py"), "--out_dir", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for split in ("train", "val"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (EXAMPLE / "data" / f"{split}.jsonl").read_text()
    dataset = check_agent_env_config({"dataset": str(EXAMPLE / "data" / "train_agent.jsonl")})
    assert len(dataset.rows) == 240
    for row in dataset.rows[:30]:  # the reference answer, boxed, earns the reward
        assert math_reward(row, f"\\boxed{{{row['answer']}}}") == 1.0


def test_tiny_math_preset_covers_the_data_and_keeps_tool_tags_whole():
    from roll.models.tiny import build_tiny_tokenizer
    from roll.pipeline.tiny_model import PRESETS, corpus_and_tokens

    corpus, extra = corpus_and_tokens(*PRESETS["math"])
    tok = build_tiny_tokenizer(corpus, extra)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>'
    ids = tok.encode(call, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>") and ids[-1] == tok.convert_tokens_to_ids("</tool_call>")
    from roll.agentic.agent_loop.tools import parse_tool_calls

    (parsed,) = parse_tool_calls(tok.decode(ids))
    assert parsed.name == "calculator" and calculator(**parsed.arguments) == "84"
    for text in corpus[:300]:
        assert tok.unk_token_id not in tok.encode(text, add_special_tokens=False), text
