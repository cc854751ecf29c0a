"""GuessNumber: a user's environment in a few lines (README.md beside this file explains it).

A number is hidden in 1..`max_number`; after each guess the observation says whether it was too
low or too high and which range is left. Because the observation carries the range, a step-wise
policy that sees only the current observation can play perfectly: guess the middle (binary
search). Numbers 1-9 are single tokens of the tiny model's tokenizer, so with `max_number <= 9`
an action is one token, the easiest case for a model trained from random init.
"""

from __future__ import annotations

from typing import Any

from roll.agentic.env import TextEnv


class GuessNumberEnv(TextEnv):
    """Reward 1 and the end of the episode for the right number, 0 for a wrong one; truncated
    after `max_guesses` guesses. `episode_metrics`: `guesses` made so far."""

    instruction = (
        "Guess the hidden number. After each guess you learn if it was too low or too high. "
        "Answer with one number, like <answer>3</answer>."
    )

    def __init__(
        self,
        max_number: int = 8,
        max_guesses: int = 4,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(format_penalty=format_penalty, render_mode=render_mode)
        if max_number < 2 or max_guesses < 1:
            raise ValueError(f"need max_number >= 2, max_guesses >= 1: {max_number}, {max_guesses}")
        self.max_number, self.max_guesses = max_number, max_guesses
        self.actions = tuple(str(n) for n in range(1, max_number + 1))
        self._target, self._low, self._high, self._guesses, self._found = 0, 1, max_number, 0, False

    @property
    def success(self) -> bool:
        return self._found

    def episode_metrics(self) -> dict[str, float]:
        return {"guesses": float(self._guesses)}

    def _reset(self, options: dict[str, Any]) -> str:
        self._target = int(self.np_random.integers(1, self.max_number + 1))
        self._low, self._high, self._guesses, self._found = 1, self.max_number, 0, False
        return f"The number is between 1 and {self.max_number}."

    def _apply(self, action: str) -> tuple[str, float, bool, bool]:
        if self._found:  # the episode is over: nothing changes any more
            return f"{self._target} is right!", 0.0, True, False
        guess = int(action)
        self._guesses += 1
        if guess == self._target:
            self._found = True
            return f"{guess} is right!", 1.0, True, False
        if guess < self._target:
            self._low, feedback = max(self._low, guess + 1), "too low"
        else:
            self._high, feedback = min(self._high, guess - 1), "too high"
        obs = f"{guess} is {feedback}. The number is between {self._low} and {self._high}."
        return obs, 0.0, False, self._guesses >= self.max_guesses

    def scripted_action(self) -> str | None:
        """Binary search: the middle of the range left (None once the number is found)."""
        return None if self._found else f"<answer>{(self._low + self._high) // 2}</answer>"
