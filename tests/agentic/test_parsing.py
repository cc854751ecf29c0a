"""Action parsing: exact answers on tricky text, and no exception on any text at all."""

import random
import re

import pytest

import envs  # noqa: F401  registers the built-ins (the entry point may not be installed)
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.env.parsing import extract_answer, match_choice, strip_special_tokens

MOVES = ("Left", "Down", "Right", "Up")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>Left</answer>", "Left"),
        ("<ANSWER> Left </Answer>", "Left"),
        ("< answer >up</ answer >", "up"),
        ("<answer>\n  Down\n</answer><|im_end|>", "Down"),
        ("<|im_start|>assistant\n<answer>Down</answer><|im_end|>", "Down"),
        ("<answer>Ri<|im_end|>ght</answer>", "Right"),
        ("<answer>Up<|endoftext|>", "Up"),
        ("<answer>Up</s>", "Up"),
        ("<s><answer><pad>Left<eos></answer>", "Left"),
        ("<answer><unk>Left</answer>", "Left"),
        ("<answer>Left<｜end▁of▁sentence｜>", "Left"),
        ("<answer>Left", "Left"),  # cut at max_new_tokens
        ("think first. <answer>Left</answer> or <answer>Right</answer>", "Left"),
        ("<answer><answer>Up</answer></answer>", "Up"),
        ("<answer>Up<answer>Left", "Left"),
        ("</answer>Left<answer>Down</answer>", "Down"),
        ("<answer> up  down </answer>", "up  down"),
        ("<answer><|Left</answer>", "<|Left"),
        ("<answer></answer>", ""),
        ("<answer>", ""),
        ("", None),
        ("Left", None),
        ("answer: Left", None),
        ("<answer Left</answer>", None),
        ("<answers>Left</answers>", None),
        ("Left</answer>", None),
    ],
)
def test_extract_answer_table(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_other_tag_and_non_text():
    assert extract_answer("<action>Up</action>", tag="action") == "Up"
    assert extract_answer("<answer>Up</answer>", tag="action") is None
    assert extract_answer(None) is None
    assert extract_answer(b"<answer>Up</answer>") is None


def test_strip_special_tokens():
    assert strip_special_tokens("a<|im_end|>b</s>c<S><PAD>d<|eot_id|>") == "abcd"
    assert strip_special_tokens("a < | b | > <|two words|>") == "a < | b | > <|two words|>"


@pytest.mark.parametrize(
    ("content", "choices", "expected"),
    [
        ("Left", MOVES, "Left"),
        ("left", MOVES, "Left"),
        ("  UP \n", MOVES, "Up"),
        ("le ft", MOVES, None),
        ("Left.", MOVES, None),
        ("Left Right", MOVES, None),
        ("", MOVES, None),
        ("   ", MOVES, None),
        (None, MOVES, None),
        ("Left", (), None),
        ("buy\n   NOW", ("Search", "Buy Now"), "Buy Now"),
    ],
)
def test_match_choice_table(content, choices, expected):
    assert match_choice(content, choices) == expected


def _random_text(rng: random.Random) -> str:
    tags = ["<answer>", "</answer>", "<ANSWER >", "< / answer>", "<|im_end|>", "</s>", "<pad>"]
    words = ["Left", "down", " RIGHT ", "Up", "\n", " ", "<", ">", "|", "/", "｜", "√"]
    pieces = []
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        if kind < 0.35:
            pieces.append(rng.choice(tags))
        elif kind < 0.5:
            tag = rng.choice(tags)
            start = rng.randint(0, len(tag))
            pieces.append(tag[start : rng.randint(start, len(tag))])
        elif kind < 0.8:
            pieces.append(rng.choice(words))
        else:
            pieces.append("".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(1, 4))))
    return "".join(pieces)


def test_fuzz_parser_and_step_never_raise():
    rng = random.Random(0)
    env = FrozenLakeEnv(size=4, format_penalty=-0.25)
    obs, _ = env.reset(seed=0)
    opening = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
    valid = invalid = 0
    for i in range(10_000):
        text = _random_text(rng)
        content = extract_answer(text)
        if content is not None:
            assert content == content.strip()
            assert opening.search(strip_special_tokens(text))
        action = match_choice(content, MOVES)
        assert action is None or action in MOVES
        new_obs, reward, terminated, truncated, info = env.step(text)
        assert info["action_is_valid"] is (action is not None)
        assert new_obs in env.observation_space
        assert truncated is False
        if action is None:
            invalid += 1
            assert (new_obs, reward, terminated) == (obs, -0.25, False)
        else:
            valid += 1
        obs = new_obs
        if terminated:
            obs, _ = env.reset(seed=i)
    # both paths of step were exercised many times
    assert valid > 100 and invalid > 5000
