"""The shared enums: how an episode becomes samples, and why it stopped.

Both are `StrEnum`s: a member equals its string ("traj" == SampleMode.TRAJ), so configs, JSON
traces and metric names keep the plain strings.
"""

from __future__ import annotations

from enum import StrEnum


class SampleMode(StrEnum):
    """How episodes become training samples (`env_manager_type`): read once, where the pipeline and
    the env workers are built, and carried from there."""

    TRAJ = "traj"
    """One sample per trajectory: the whole conversation as one token sequence (StarPO)."""
    STEP = "step"
    """One sample per env step, its prompt rebuilt from text (GiGPO)."""


class StopReason(StrEnum):
    """Why an episode ended. Only `TERMINATED` is a real end (the MDP reached a terminal state); the
    others cut an episode that could have gone on, so value-based estimators bootstrap from the
    value of its last state (gymnasium's terminated/truncated split)."""

    TERMINATED = "terminated"
    """The env said `terminated` (goal, failure), or an agent gave its final answer."""
    TRUNCATED = "truncated"
    """The env said `truncated` (its own time limit), or an agent's answer hit its token limit."""
    MAX_STEPS = "max_steps"
    """The manager's action budget (`custom_envs.<tag>.max_steps`, an agent's `max_turns`) ran out."""
    MAX_TOKENS = "max_tokens"
    """No room was left in `sequence_length` to generate another turn."""

    @classmethod
    def of_answer(cls, finish_reason: str) -> StopReason:
        """An agent's final answer: terminated if the engine stopped it ("stop"), truncated if it
        hit the token limit ("length")."""
        return cls.TERMINATED if finish_reason == "stop" else cls.TRUNCATED

    @property
    def is_truncation(self) -> bool:
        """True when the episode was cut rather than ended (bootstrap it)."""
        return self is not StopReason.TERMINATED
