"""Trajectory-wise env manager (StarPO): one training sample per episode.

The sample is the whole multi-turn conversation as one token sequence: the first prompt, then for
every turn the generated ids exactly as sampled (`response_mask` 1) followed by the ids that close
the turn and carry the next observation (`response_mask` 0). Step rewards are credited at the last
generated token of their turn.
"""

from __future__ import annotations

from roll.agentic.env_manager.base import BaseEnvManager, EpisodeBuilder
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.episode import TokenLedger
from roll.agentic.templates import traj_turn_text
from roll.core.records import GenerateOutput


class TrajEnvManager(BaseEnvManager):
    reuse_kv_across_turns = True  # every prompt is the previous one plus response and observation

    def new_builder(self, instruction: str | None, observation: str) -> EpisodeBuilder:
        template = self.spec.agent_template
        if template is None:
            return _ConversationBuilder(
                self.chat, instruction, observation, self.sampling.max_new_tokens, self.sequence_length
            )

        def user_text(obs: str, turn: int) -> str:  # ROLL's agent_template, filled as ROLL fills it
            return traj_turn_text(
                template, obs, turn, self.spec.max_steps - turn, self.spec.max_tokens_per_step, instruction
            )

        return _ConversationBuilder(
            self.chat,
            self.spec.agent_system_template,
            user_text(observation, 0),
            self.sampling.max_new_tokens,
            self.sequence_length,
            user_text,
        )


class _ConversationBuilder(EpisodeBuilder):
    """The episode as one growing conversation: a `TokenLedger` (shared with the agent loops)."""

    def __init__(
        self,
        chat: ChatFormatter,
        instruction: str | None,
        observation: str,
        max_new_tokens: int,
        sequence_length: int,
        user_text=None,
    ):
        self.chat = chat
        self.user_text = user_text  # (observation, turn) -> the user message; None: the observation
        self.budget = sequence_length - max_new_tokens
        self.ledger = TokenLedger(chat.initial_prompt(instruction, observation))

    def prompt(self) -> list[int] | None:
        return self.ledger.token_ids if len(self.ledger.token_ids) <= self.budget else None

    def add_response(self, out: GenerateOutput, reward: float) -> None:
        self.ledger.add_turn(out)

    def add_observation(self, observation: str, out: GenerateOutput, reward: float) -> None:
        if self.user_text is not None:
            observation = self.user_text(observation, len(self.ledger.turn_ends))
        self.ledger.add_context(self.chat.next_turn(observation, out.token_ids))

    def sample_fields(self) -> dict:
        return self.ledger.sample_fields()
