"""`TextEnv`: the one base class every roll environment (built-in or user) subclasses.

Contract (DESIGN.md "Environments"):
- `reset(*, seed=None, options=None) -> (obs, info)` with `info["env_instruction"]` (the task text,
  shown once) and `info["metrics"] == {}`.
- `step(action) -> (obs, reward, terminated, truncated, info)`; `action` is the raw model text.
  `info` always has `action_is_valid: bool`, `success: bool` and `metrics: dict[str, float]`
  (episode-so-far: `num_actions`, `num_invalid` plus the env's `episode_metrics()`), so the last
  step's metrics are the episode's.
- An action that does not parse is a valid *step*: no state change, the same observation,
  `format_penalty` reward, not terminated. `step` never raises for any `str`.

A subclass implements only `actions`, `instruction`, `_reset`, `_apply`, `success` and optionally
`episode_metrics`, `tool_schemas` / `tool_call_action` (its actions as OpenAI function tools, for
a tool-calling agent), `scripted_action` (a competent move, for local play and scripted tests) and
`frame_to_rgb` (an image of a frame; add "rgb_array" to `metadata["render_modes"]`), and draws all
randomness from `self.np_random` so that equal seeds give equal rollouts. A subclass whose
observations need characters outside `CHARSET` (or longer than `MAX_TEXT_CHARS`) reassigns
`self.observation_space` after `super().__init__`, preferably to `text_space(...)`, which every
env asking for the same space shares.

`cheap_calls` names the calls ("reset", "step") an env manager may make in its event loop (well
under a millisecond, waiting on nothing). An env waiting on I/O writes `async def _aapply` /
`_areset`: it gets `astep` / `areset`, awaited in that loop (docs/custom_env.md).
"""

from __future__ import annotations

import abc
import asyncio
import functools
import inspect
import re
import string
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from roll.agentic.env.parsing import extract_answer, match_choice

# Printable ASCII (with newline), Latin-1 letters and the symbols our grids and pages print.
_LATIN1 = "".join(map(chr, range(0xA1, 0x100)))
CHARSET = string.printable + _LATIN1 + "√•…–—‘’“”€™"
# Longest observation (or sampled action) in characters; responses longer than this still parse.
MAX_TEXT_CHARS = 8192


class SharedText(spaces.Text):
    """A `spaces.Text` that many envs hold at once, so it cannot be changed after it is built.

    A `Text` space indexes its whole character set (about 22 KB for `CHARSET`); one per env was
    most of an env's memory. Assigning an attribute raises, and the character index is a
    read-only mapping. Only the sampling generator (`seed`, `sample`) is shared state: envs
    never draw from their spaces (their randomness is `env.np_random`), so seeding one env's
    space changes no env's rollouts, only what the shared space samples next. Pickling and
    copying give back the shared instance of the same arguments (a fresh sampling generator
    after unpickling)."""

    def __init__(self, max_length: int, *, min_length: int = 1, charset: str | frozenset[str] = ""):
        super().__init__(max_length, min_length=min_length, charset=charset)
        object.__setattr__(self, "_char_index", MappingProxyType(self._char_index))
        object.__setattr__(self, "_charset_arg", charset)
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False) and name != "_np_random":
            raise AttributeError(
                f"{type(self).__name__} is shared by many envs and read-only; assign "
                f"the env a new space instead of changing {name!r}"
            )
        super().__setattr__(name, value)

    def __reduce__(self):
        return text_space, (self.max_length, self.min_length, self._charset_arg)

    def __copy__(self) -> SharedText:
        return self

    def __deepcopy__(self, memo: dict) -> SharedText:
        return self


def text_space(max_length: int = MAX_TEXT_CHARS, min_length: int = 0, charset: str = CHARSET) -> SharedText:
    """The one `SharedText` with these arguments in this process (envs share their spaces)."""
    return _shared_text(max_length, min_length, charset)


@functools.cache
def _shared_text(max_length: int, min_length: int, charset: str) -> SharedText:
    return SharedText(max_length, min_length=min_length, charset=charset)


class TextEnv(gym.Env[str, str], abc.ABC):
    """A gymnasium env whose observations and actions are text; see the module docstring."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    actions: tuple[str, ...] = ()
    instruction: str = ""
    cheap_calls: frozenset[str] = frozenset()  # of "reset", "step": see the module docstring

    def __init__(
        self,
        *,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
        action_pattern: str | None = None,
        env_instruction: str | None = None,
    ) -> None:
        """`action_pattern` and `env_instruction` are ROLL's env_config keys: a regex whose last
        group is the action (None: `<answer>...</answer>`), and the task text reported as
        `info["env_instruction"]` instead of the env's own."""
        if action_pattern is not None:
            try:
                re.compile(action_pattern)
            except re.error as err:
                raise ValueError(f"action_pattern {action_pattern!r} is not a regex: {err}") from None
        self.action_pattern = action_pattern
        self.env_instruction = env_instruction
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} not in {self.metadata['render_modes']}")
        self.format_penalty = float(format_penalty)
        self.render_mode = render_mode
        self.observation_space = text_space()
        self.action_space = text_space()
        self._frame: str | None = None
        self._num_actions = 0
        self._num_invalid = 0

    # --- the surface a subclass implements -------------------------------------------------
    @abc.abstractmethod
    def _reset(self, options: dict[str, Any]) -> str:
        """Start a new episode using `self.np_random`; return the first observation."""

    @abc.abstractmethod
    def _apply(self, action: str) -> tuple[str, float, bool, bool]:
        """Play one parsed action (one of `actions`): (obs, reward, terminated, truncated)."""

    # Optional, for an env that waits on I/O (a remote service, a sandbox): `async def _areset` /
    # `async def _aapply`, the same contracts as `_reset` / `_apply`. Written in a subclass, they
    # give it `areset` / `astep`, which an env manager awaits in its event loop (no thread). A sync
    # hook the subclass does not write itself runs its async twin to the end (`asyncio.run`), so `step`
    # and `reset` keep working outside an event loop (`roll.agentic.play`, the config checks).
    _areset: Callable[[dict[str, Any]], Awaitable[str]]
    _aapply: Callable[[str], Awaitable[tuple[str, float, bool, bool]]]

    @property
    @abc.abstractmethod
    def success(self) -> bool:
        """True when the current episode is solved."""

    def episode_metrics(self) -> dict[str, float]:
        """Env-specific per-episode numbers reported in every step's `info["metrics"]`."""
        return {}

    def scripted_action(self) -> str | None:
        """Raw model text for a good move from the current state (an oracle or heuristic agent
        for `python -m roll.agentic.play --agent scripted` and multi-turn tests), or None when the
        env has no scripted agent. Must not change the env's state or consume `np_random`."""
        return None

    def sample_valid_action(self, rng: np.random.Generator) -> str | None:
        """Raw model text for a uniformly random action the current state accepts (a format
        teacher with no preference among moves: `roll.pipeline.warm_start`), or None when the env
        cannot list its actions. Draws only from `rng`; must not change the env's state."""
        if not self.actions:
            return None
        return f"<answer>{self.actions[int(rng.integers(len(self.actions)))]}</answer>"

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The env's actions as OpenAI function tools (`{"type": "function", "function": {...}}`),
        or [] when it has none of its own. A tool-calling runner offers them and turns each call
        into action text with `tool_call_action`."""
        return []

    def tool_call_action(self, name: str, arguments: Any) -> str:
        """The raw action text of a call of tool `name` with its decoded JSON `arguments` (text
        that `parse_action` rejects for a call it cannot take)."""
        return ""

    @classmethod
    def frame_to_rgb(cls, frame: str) -> np.ndarray | None:
        """An (H, W, 3) uint8 image of the text `frame`, or None for an env without images.

        A classmethod, so saved frames can be drawn later from text alone (`render_save_dir`)."""
        return None

    def parse_action(self, text: str) -> str | None:
        """The action word in the raw model `text`, or None. Override for another answer format."""
        if self.action_pattern is not None:  # ROLL's: the last group of the first match
            match = re.search(self.action_pattern, text, re.DOTALL)
            content = match.group(match.lastindex or 0) if match else None
            return match_choice(content, self.actions)
        return match_choice(extract_answer(text), self.actions)

    # --- the gymnasium API, final ----------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._begin_reset(seed)
        self._frame = self._reset(dict(options or {}))
        return self._end_reset()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        parsed = self._begin_step(action)
        result = self._unparsed_result() if parsed is None else self._apply(parsed)
        return self._end_step(parsed, result)

    # `areset` / `astep`: set on a subclass that writes `_areset` / `_aapply` (`__init_subclass__`)
    async def _async_reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._begin_reset(seed)
        self._frame = await self._areset(dict(options or {}))
        return self._end_reset()

    async def _async_step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        parsed = self._begin_step(action)
        result = self._unparsed_result() if parsed is None else await self._aapply(parsed)
        return self._end_step(parsed, result)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _wire_async_hooks(cls)

    def _begin_reset(self, seed: int | None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        super().reset(seed=None if seed is None else int(seed))
        self._num_actions = 0
        self._num_invalid = 0

    def _end_reset(self) -> tuple[str, dict[str, Any]]:
        assert self._frame is not None
        return self._frame, {"env_instruction": self.env_instruction or self.instruction, "metrics": {}}

    def _begin_step(self, action: str) -> str | None:
        if self._frame is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        self._num_actions += 1
        parsed = self.parse_action(action)
        if parsed is None:
            self._num_invalid += 1
        return parsed

    def _unparsed_result(self) -> tuple[str, float, bool, bool]:
        assert self._frame is not None
        return self._frame, self.format_penalty, False, False

    def _end_step(
        self, parsed: str | None, result: tuple[str, float, bool, bool]
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated = result
        if parsed is not None:
            self._frame = obs
        metrics = {
            "num_actions": float(self._num_actions),
            "num_invalid": float(self._num_invalid),
            **self.episode_metrics(),
        }
        info = {
            "action_is_valid": parsed is not None,
            "success": bool(self.success),
            "metrics": metrics,
        }
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | np.ndarray | None:
        """The current frame: its text in "ansi" mode (what the last observation showed), its
        image (`frame_to_rgb`) in "rgb_array" mode, None without a render mode or a reset."""
        if self._frame is None or self.render_mode is None:
            return None
        return self._frame if self.render_mode == "ansi" else self.frame_to_rgb(self._frame)


# (sync call, its hook, the hook's async twin, the coroutine a class writing the twin gets as `a<call>`)
_ASYNC_HOOKS = (
    ("reset", "_reset", "_areset", TextEnv._async_reset),
    ("step", "_apply", "_aapply", TextEnv._async_step),
)


def _wire_async_hooks(cls: type[TextEnv]) -> None:
    """Give `cls` `areset` / `astep` for the async hooks it writes, and a sync hook that runs the
    async one where it writes only that (even over a parent's concrete sync hook). A class that
    writes a sync hook (or `reset` / `step`) but not its twin has the public coroutine set to None:
    an inherited `astep` would skip the override, so the env manager takes the sync path."""
    for call, sync_hook, async_hook, coroutine in _ASYNC_HOOKS:
        public = f"a{call}"
        if async_hook in cls.__dict__:
            if not inspect.iscoroutinefunction(cls.__dict__[async_hook]):
                raise TypeError(f"{cls.__name__}.{async_hook} must be a coroutine function (async def)")
            setattr(cls, public, coroutine)
            if sync_hook not in cls.__dict__:  # its sync twin, not an inherited one, runs sync calls
                setattr(cls, sync_hook, _run_to_end(call, sync_hook, async_hook))
        elif (sync_hook in cls.__dict__ or call in cls.__dict__) and public not in cls.__dict__:
            setattr(cls, public, None)


def _run_to_end(call: str, sync_hook: str, async_hook: str) -> Callable[..., Any]:
    """A sync hook that runs `async_hook` on a fresh event loop (not from inside a running one)."""

    def hook(self: TextEnv, *args: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop running here: run the coroutine on a fresh one
            return asyncio.run(getattr(self, async_hook)(*args))
        raise RuntimeError(
            f"{type(self).__name__}.{call} runs the async {async_hook} and cannot be called inside a running "
            f"event loop: await {type(self).__name__}.a{call} instead"
        )

    hook.__name__ = sync_hook
    hook.__doc__ = f"`{async_hook}` run to the end on a fresh event loop."
    return hook
