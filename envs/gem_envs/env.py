"""GEM envs ("a Gym for Generalist LLMs", the gem-llm package) as roll `TextEnv`s.

`env_type` is a GEM id (`game:GuessTheNumber-v0`, `rg:letter_counting`, ...); the env is
`gem.make(env_id, **env_config)`, as ROLL makes it, and keeps GEM's own semantics: GEM parses the
raw response (`\\boxed{...}`), gives the rewards and decides when the episode ends, so every
response is a valid *step* to roll (`action_is_valid` is always true; a GEM game may end an
episode on a malformed answer, as it does under ROLL). Differences, on purpose:
- GEM seeds and draws from the process-global `random` / `np.random`; here each env owns its own
  streams (swapped in under one lock around every GEM call), so equal seeds give equal rollouts
  whatever other envs of the process do. `reset(seed)` hands GEM a seed drawn from `np_random`.
- A GEM id backed by a hub dataset (`math:`, `qa:`, `code:`, `logic:`, `eval:` ids; GEM registers
  them with `dataset_name`) is refused by name before start: nothing is downloaded here.
- ROLL's `tool_wrapper` with a `python_code` tool wraps the env in GEM's `ToolEnvWrapper`, but
  the code runs in this episode's `roll.agentic.sandbox.Sandbox` (`tools.SandboxedPythonCodeTool`)
  instead of GEM's unisolated subprocess; other tools are refused by name.
`success` is a final reward of at least 1 (GEM's win reward; a fully correct reasoning-gym answer).
"""

from __future__ import annotations

import contextlib
import random
import threading
from typing import Any

import numpy as np

from roll.agentic.env import TextEnv
from roll.agentic.env.base import CHARSET, text_space
from roll.agentic.env.parsing import strip_special_tokens

INSTALL_HINT = "GEM env ids need the gem-llm package: bash scripts/install_gem.sh"
_GLOBAL_RANDOM = threading.RLock()  # GEM draws from process-global generators: one call at a time
MAX_OBS_CHARS = 65536


def gem_registry() -> dict[str, Any]:
    """GEM's env registry (importing gem registers its envs), or ValueError naming the fix."""
    try:
        from gem.envs.registration import ENV_REGISTRY
    except ImportError as err:
        raise ValueError(f"{INSTALL_HINT} ({err})") from None
    return ENV_REGISTRY


class GemEnv(TextEnv):
    """A GEM env behind the `TextEnv` API; see the module docstring."""

    actions: tuple[str, ...] = ()  # GEM parses the raw response itself

    @classmethod
    def check_env_id(cls, env_id: str) -> None:
        """ValueError naming `env_id` when GEM does not have it or it needs a hub dataset."""
        registry = gem_registry()
        if env_id not in registry:
            near = sorted(k for k in registry if k.split(":")[0] == env_id.split(":")[0])[:12]
            raise ValueError(f"{env_id!r} is not a GEM env id of the installed gem-llm; some of its ids: {near}")
        dataset = registry[env_id].kwargs.get("dataset_name")
        if dataset:
            raise ValueError(
                f"{env_id!r} is a GEM env over the hub dataset {dataset!r}, which is not available here "
                "(no downloads); GEM's game: and rg: envs generate their tasks locally"
            )

    def __init__(
        self,
        env_id: str,
        tool_wrapper: dict[str, Any] | None = None,
        sandbox: dict[str, Any] | None = None,
        isolation: str = "auto",
        format_penalty: float = 0.0,
        render_mode: str | None = None,
        env_instruction: str | None = None,
        **gem_kwargs: Any,
    ) -> None:
        super().__init__(format_penalty=format_penalty, render_mode=render_mode, env_instruction=env_instruction)
        self.check_env_id(env_id)
        self.env_id = env_id
        self.observation_space = text_space(MAX_OBS_CHARS, charset=CHARSET + "｜")
        self._py_random = random.Random(0)  # this env's streams (see _own_random)
        self._np_random_state = np.random.RandomState(0).get_state()
        self._tools = None
        import gem

        try:
            with self._own_random():
                env = gem.make(env_id, **gem_kwargs)
        except LookupError as err:  # NLTK data (Wordle's and Hangman's word lists) is a download
            raise ValueError(f"{env_id!r} needs data that is not installed here: {str(err).strip()[:300]}") from None
        if tool_wrapper is not None:
            from envs.gem_envs.tools import wrap_with_tools

            env, self._tools = wrap_with_tools(env, tool_wrapper, sandbox=sandbox, isolation=isolation)
        self._gem = env
        self._last_reward = 0.0
        self._done = False

    @contextlib.contextmanager
    def _own_random(self):
        """Run a GEM call on this env's own `random` / `np.random` streams."""
        with _GLOBAL_RANDOM:
            outer_py, outer_np = random.getstate(), np.random.get_state()
            random.setstate(self._py_random.getstate())
            np.random.set_state(self._np_random_state)
            try:
                yield
            finally:
                self._py_random.setstate(random.getstate())
                self._np_random_state = np.random.get_state()
                random.setstate(outer_py)
                np.random.set_state(outer_np)

    def parse_action(self, text: str) -> str | None:
        return strip_special_tokens(text) if isinstance(text, str) else None

    def _reset(self, options: dict[str, Any]) -> str:
        seed = int(self.np_random.integers(2**31 - 1))
        if self._tools is not None:
            self._tools.new_episode()
        with self._own_random():
            obs, info = self._gem.reset(seed=seed)
        self._last_reward, self._done = 0.0, False
        return self._with_suffix(obs, info)

    def _apply(self, action: str) -> tuple[str, float, bool, bool]:
        if self._done:  # stepped after the end: nothing happens
            return self._frame or "", 0.0, True, False
        with self._own_random():
            obs, reward, terminated, truncated, info = self._gem.step(action)
        self._last_reward = float(reward)
        self._done = bool(terminated or truncated)
        if self._done and self._tools is not None:
            self._tools.end_episode()
        return self._with_suffix(obs, info), float(reward), bool(terminated), bool(truncated) and not terminated

    @staticmethod
    def _with_suffix(obs: Any, info: dict) -> str:
        """GEM's observation and its `suffix` (what to do next), as ROLL's StepConcatEnvManager
        shows them: `observation\\nsuffix`."""
        text = str(obs)
        suffix = info.get("suffix") if isinstance(info, dict) else None
        return (f"{text}\n{suffix}" if suffix else text)[:MAX_OBS_CHARS]

    @property
    def success(self) -> bool:
        return self._done and self._last_reward >= 1.0

    def episode_metrics(self) -> dict[str, float]:
        return self._tools.metrics() if self._tools is not None else {}

    def close(self) -> None:
        if self._tools is not None:
            self._tools.end_episode()
        super().close()
