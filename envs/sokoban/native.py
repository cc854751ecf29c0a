"""Sokoban that keeps its own chat (ROLL's `sokoban_native_env`), for the native step manager.

The game, rewards and observation are `SokobanEnv`'s. Besides, the env writes the conversation an
agent would have with it, as ROLL's SokobanNativeEnv does: a system message (`system_template`
and the task), a user message with the first state, then after every step the assistant's answer
and a user message with the new state. It is handed out whole as `info["messages"]` after reset
and after each step; `roll.agentic.env_manager.native_env_manager` renders it as the prompt.

Differs from ROLL's in one place: ROLL prefixes its "the last action is not valid" reminder to the
next state after a *valid* action (its condition is inverted); here it follows an invalid one.
"""

from __future__ import annotations

from typing import Any

from envs.sokoban.env import SokobanEnv

SYSTEM_TEMPLATE = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high reward in the game."
)
INVALID_TIP = (
    "\n\n<system-reminder>\n(IMPORTANT TIPS: the last action is not valid, your new response *must* "
    "strictly adhere to the format according system-reminder.)</system-reminder>\n\n"
)


def _suffix(actions: tuple[str, ...]) -> str:
    return (
        "\n\n<system-reminder>\nIMPORTANT: Ensure that your response is the format of '<answer> [your answer] "
        "</answer>',  with no extra text, eg. <answer>Right</answer>.\nYour available actions are:\n"
        f"{', '.join(actions)}\n. </system-reminder>\n\nDecide the next action:\n"
    )


class SokobanNativeEnv(SokobanEnv):
    """`SokobanEnv` plus its chat in `info["messages"]` (module docstring). `system_template` opens
    the system message; `observation_suffix` follows every state (None: ROLL's reminder of the
    answer format and the actions)."""

    def __init__(
        self,
        *,
        max_steps: int = 10,
        system_template: str | None = None,
        observation_suffix: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, **kwargs)
        self.system_template = SYSTEM_TEMPLATE if system_template is None else system_template
        self.observation_suffix = _suffix(self.actions) if observation_suffix is None else observation_suffix
        self.messages: list[dict[str, str]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        self.messages = [
            {"role": "system", "content": f"{self.system_template}\n\n{info['env_instruction']}"},
            {"role": "user", "content": f"Here is the current state:\n{obs}\n\n{self.observation_suffix}"},
        ]
        return obs, {**info, "messages": [dict(m) for m in self.messages]}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        tip = "" if info["action_is_valid"] else INVALID_TIP
        self.messages += [
            {"role": "assistant", "content": action},
            {"role": "user", "content": f"{tip}Current state:\n{obs}\n\n{self.observation_suffix}"},
        ]
        return obs, reward, terminated, truncated, {**info, "messages": [dict(m) for m in self.messages]}
