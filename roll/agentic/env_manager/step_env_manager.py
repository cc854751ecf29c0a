"""Step-wise env manager (as in GiGPO / RAGEN's step mode): one training sample per env step.

Each step's prompt is built afresh from text: the task instruction, the last `history_length`
(observation, answer) turns, and the current observation. Only the generated ids are the
engine's own; the prompt is re-templated every step by design, since each step is its own sample.
Every sample carries the hash of the observation it answered, so GiGPO can find the steps of one
group that stood in the same state (anchor states).
"""

from __future__ import annotations

import hashlib

from roll.agentic.env_manager.base import BaseEnvManager, EpisodeBuilder
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.templates import step_prompt_text
from roll.core.records import GenerateOutput, StepRecord


def state_hash(observation: str) -> str:
    return hashlib.blake2b(observation.encode(), digest_size=8).hexdigest()


class StepEnvManager(BaseEnvManager):
    def __init__(self, *args, history_length: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.history_length = history_length

    def new_builder(self, instruction: str | None, observation: str) -> EpisodeBuilder:
        budget = self.sequence_length - self.sampling.max_new_tokens
        if self.spec.agent_template is not None:
            return _TemplateStepBuilder(
                self.chat,
                instruction,
                observation,
                self.history_length,
                budget,
                self.spec.agent_template,
                self.spec.agent_system_template,
                self.spec.max_tokens_per_step,
                self.spec.concat_history,
            )
        return _StepBuilder(self.chat, instruction, observation, self.history_length, budget)


class _StepBuilder(EpisodeBuilder):
    def __init__(
        self, chat: ChatFormatter, instruction: str | None, observation: str, history_length: int, budget: int
    ):
        self.chat = chat
        self.system = [{"role": "system", "content": instruction}] if instruction else []
        self.history_length = history_length
        self.budget = budget
        self.turns: list[tuple[str, str]] = []  # (user text, assistant text), oldest first
        self.user_text = observation
        self.observation = observation
        self.steps: list[StepRecord] = []
        self._prompt: list[int] = []

    def prompt(self) -> list[int] | None:
        window = self.turns[-self.history_length :] if self.history_length else []
        messages = list(self.system)
        for user, assistant in window:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        messages.append({"role": "user", "content": self.user_text})
        ids = self.chat.template_ids(messages, add_generation_prompt=True) + self.chat.prefix_ids
        self._prompt = ids
        return ids if len(ids) <= self.budget else None

    def add_response(self, out: GenerateOutput, reward: float) -> None:
        self.steps.append(
            StepRecord(
                step=len(self.steps),
                prompt_ids=self._prompt,
                response_ids=list(out.token_ids),
                logprobs=list(out.logprobs),
                versions=list(out.token_versions),
                reward=reward,
                state_hash=state_hash(self.observation),
            )
        )

    def add_observation(self, observation: str, out: GenerateOutput, reward: float) -> None:
        self.turns.append((self.user_text, self.chat.response_text(out.token_ids)))
        self.observation = observation
        # with a history window the model also sees what its last answer earned
        self.user_text = f"Reward: {reward:g}\n{observation}" if self.history_length else observation

    def sample_fields(self) -> dict:
        return {"steps": self.steps}


class _TemplateStepBuilder(_StepBuilder):
    """ROLL's step prompt: an optional system message (`agent_system_template`) and one user
    message, `agent_template` filled with the instruction, the last `history_length` steps as
    text, and the current observation (`roll.agentic.templates.step_prompt_text`)."""

    def __init__(
        self,
        chat: ChatFormatter,
        instruction: str | None,
        observation: str,
        history_length: int,
        budget: int,
        template: str,
        system_template: str | None,
        max_response_length: int,
        concat_history: bool = False,
    ):
        super().__init__(chat, None, observation, history_length, budget)
        self.concat_history = concat_history
        self.instruction = instruction or ""
        self.template = template
        self.system = [{"role": "system", "content": system_template}] if system_template is not None else []
        self.max_response_length = max_response_length
        self.history: list[tuple[str, str, float]] = []  # (observation, action, reward)

    def prompt(self) -> list[int] | None:
        # ROLL's StepConcatEnvManager shows history[-h:-1] of a history that ends with the current step
        window = self.history_length - 1 if self.concat_history else self.history_length
        shown = self.history[-window:] if window > 0 else []
        text = step_prompt_text(
            self.template,
            env_instruction=self.instruction,
            history=shown,
            step=len(self.steps),
            observation=self.observation,
            max_response_length=self.max_response_length,
            concat=self.concat_history,
        )
        messages = [*self.system, {"role": "user", "content": text}]
        ids = self.chat.template_ids(messages, add_generation_prompt=True) + self.chat.prefix_ids
        self._prompt = ids
        return ids if len(ids) <= self.budget else None

    def add_observation(self, observation: str, out: GenerateOutput, reward: float) -> None:
        self.history.append((self.observation, self.chat.response_text(out.token_ids), reward))
        self.observation = observation
