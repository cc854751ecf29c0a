"""Play any registered env in the terminal, or watch a random or scripted agent play it.

    python -m roll.agentic.play --env frozen_lake [--agent human|random|scripted] [--seed N]
        [--episodes K] [--env_config JSON] [--max_steps M]

Why: the quickest check of a new env is to play it by hand and to let a random agent hammer it.
Each step prints the action, reward, terminated/truncated and info (metrics), then the new
observation; each episode ends with a summary line, the run with a total. Episode k is reset
with seed `seed + k`, so a run is reproducible.

Agents:
- human: types an action per step; a bare word (`Left`, `search[shoes]`) is sent as
  `<answer>Left</answer>`, text with a tag is sent as typed; `q` or end of input quits.
- random: for an env with an `actions` tuple, a uniformly random action from it. For an env with
  open-text actions (empty `actions`), a coin flip between the env's scripted move (when it has
  one) and garbage text (random characters, inside `<answer>` tags half of the time), so that an
  open-text env is both moved around and fed unparsable text. Seeded by `--seed`.
- scripted: the env's own `scripted_action()` (an error if the env has none).
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import gymnasium as gym
import numpy as np

from roll.agentic.env.base import TextEnv
from roll.agentic.env.registry import make_env, text_env_of

# An agent maps (the unwrapped env, its observation) to the raw text it sends, or None when it
# has no move.
Agent = Callable[[TextEnv, str], str | None]
AGENTS = ("human", "random", "scripted")
_GARBAGE_CHARS = string.ascii_letters + string.digits + string.punctuation + " "
_TAG = re.compile(r"<[^<>]+>")


class Quit(Exception):
    """The human asked to stop playing (`q` or end of input)."""


@dataclass
class EpisodeSummary:
    """How one episode went. `end` is "terminated", "truncated", "max_steps", "no_move" (the agent
    had no action) or "quit"."""

    seed: int
    steps: int
    reward: float
    success: bool
    invalid_actions: int
    end: str


def as_answer(text: str) -> str:
    """`text` as the model would write it: wrapped in `<answer>…</answer>` unless it has a tag."""
    text = text.strip()
    return text if _TAG.search(text) else f"<answer>{text}</answer>"


def human_agent(stdin: TextIO, out: TextIO) -> Agent:
    """Reads one action per step from `stdin` (see `as_answer`); `q` or end of input quits."""

    def act(env: TextEnv, obs: str) -> str:
        out.write("action> ")
        out.flush()
        line = stdin.readline()
        if not line or line.strip().lower() == "q":
            raise Quit
        return as_answer(line)

    return act


def random_agent(seed: int) -> Agent:
    """A uniformly random action, or for open-text envs scripted moves mixed with garbage (see
    the module docstring); every draw comes from one generator seeded with `seed`."""
    rng = np.random.default_rng(seed)

    def act(env: TextEnv, obs: str) -> str:
        if env.actions:
            return f"<answer>{env.actions[rng.integers(len(env.actions))]}</answer>"
        scripted = env.scripted_action()
        if scripted is not None and rng.random() < 0.5:
            return scripted
        chars = rng.choice(list(_GARBAGE_CHARS), size=int(rng.integers(1, 30)))
        garbage = "".join(chars)
        return f"<answer>{garbage}</answer>" if rng.random() < 0.5 else garbage

    return act


def scripted_agent(env: TextEnv) -> Agent:
    """The env's `scripted_action()`; a ValueError up front when the env has none."""
    if type(env).scripted_action is TextEnv.scripted_action:
        raise ValueError(
            f"{type(env).__name__} has no scripted agent (it does not implement "
            "scripted_action); use --agent random or human"
        )
    return lambda env, obs: env.scripted_action()


def _show_info(info: dict[str, Any]) -> str:
    metrics = info.get("metrics") or {}
    rest = {k: v for k, v in info.items() if k != "metrics"}
    shown = " ".join(f"{k}={v:g}" for k, v in metrics.items())
    return f"info: {rest}\nmetrics: {shown or '-'}"


def play_episode(env: gym.Env, agent: Agent, seed: int, max_steps: int, out: TextIO) -> EpisodeSummary:
    """One episode from `reset(seed=seed)` for at most `max_steps` actions, printed to `out`.
    `env` is a `TextEnv`, possibly wrapped (`make_env` with `fault_injection`)."""
    obs, info = env.reset(seed=seed)
    out.write(f"instruction: {info.get('env_instruction', '')}\n")
    extra = {k: v for k, v in info.items() if k not in ("env_instruction", "metrics")}
    if extra:
        out.write(f"info: {extra}\n")
    out.write(f"observation:\n{obs}\n")
    summary = EpisodeSummary(seed, 0, 0.0, success=False, invalid_actions=0, end="max_steps")
    while summary.steps < max_steps:
        try:
            action = agent(text_env_of(env), obs)
        except Quit:
            summary.end = "quit"
            break
        if action is None:
            summary.end = "no_move"
            break
        obs, reward, terminated, truncated, info = env.step(action)
        summary.steps += 1
        summary.reward += float(reward)
        summary.success = bool(info.get("success", False))
        summary.invalid_actions += not info.get("action_is_valid", True)
        out.write(f"--- step {summary.steps}: action {action!r}\n")
        out.write(f"reward {reward:g}  terminated {terminated}  truncated {truncated}\n")
        out.write(f"{_show_info(info)}\nobservation:\n{obs}\n")
        if terminated or truncated:
            summary.end = "terminated" if terminated else "truncated"
            break
    return summary


def play(
    env: gym.Env,
    agent: Agent,
    *,
    episodes: int = 1,
    seed: int = 0,
    max_steps: int = 100,
    out: TextIO = sys.stdout,
) -> list[EpisodeSummary]:
    """Play `episodes` episodes (episode k with env seed `seed + k`); stops early when the human
    quits. Prints every step and a summary per episode and for the run; returns the summaries."""
    summaries = []
    for k in range(episodes):
        out.write(f"=== episode {k + 1}/{episodes} (seed {seed + k}) ===\n")
        s = play_episode(env, agent, seed + k, max_steps, out)
        summaries.append(s)
        outcome = "success" if s.success else "failure"
        out.write(
            f"=== episode {k + 1}: {outcome}, reward {s.reward:g} in {s.steps} steps "
            f"({s.invalid_actions} invalid), ended by {s.end} ===\n"
        )
        if s.end == "quit":
            break
    wins = sum(s.success for s in summaries)
    mean = sum(s.reward for s in summaries) / max(1, len(summaries))
    out.write(f"{wins}/{len(summaries)} episodes succeeded, mean reward {mean:g}\n")
    return summaries


def make_agent(name: str, env: TextEnv, seed: int, stdin: TextIO, out: TextIO) -> Agent:
    """The agent called `name` (one of `AGENTS`) for `env`."""
    if name == "human":
        return human_agent(stdin, out)
    if name == "random":
        return random_agent(seed)
    return scripted_agent(env)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m roll.agentic.play", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="registered id, alias or module:Class")
    parser.add_argument("--agent", choices=AGENTS, default="human")
    parser.add_argument("--seed", type=int, default=0, help="env seed of the first episode")
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--env_config", default="{}", help="JSON object of constructor kwargs")
    parser.add_argument("--max_steps", type=int, default=100, help="actions per episode at most")
    return parser.parse_args(argv)


def _env_config(text: str) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--env_config is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"--env_config must be a JSON object, got {text!r}")
    return config


def main(argv: Sequence[str] | None = None, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    """The command line: 0 after playing, 2 with one line on stderr for a bad env or argument."""
    args = _parse_args(argv)
    try:
        env = make_env(args.env, _env_config(args.env_config))
        agent = make_agent(args.agent, text_env_of(env), args.seed, stdin, out)
    except (ValueError, TypeError) as err:
        print(f"python -m roll.agentic.play: error: {err}", file=sys.stderr)
        return 2
    try:
        play(env, agent, episodes=args.episodes, seed=args.seed, max_steps=args.max_steps, out=out)
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
