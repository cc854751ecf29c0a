"""Native step env manager (ROLL's AgentNativeStepEnvManager): one training sample per env step,
whose prompt is the env's own chat.

A native env keeps the conversation itself: after reset and after every step its
`info["messages"]` holds the whole chat so far, a list of {"role", "content"} messages (its
system prompt first, the latest user message last; e.g. `envs.sokoban.native`). Each step's prompt
is that chat through the chat template with the generation prompt, as ROLL renders it; the sample
is the prompt and the generated ids with the engine's log-probs, the step's reward, and the hash of
the chat it answered (GiGPO's anchor state). The env writes every message, so the tag's
`agent_system_template`, `agent_template` and `history_length` are not read (ROLL's configs set them
to placeholders). ROLL's placeholder samples for envs whose sandbox failed to start have no
counterpart: an env that fails here is dropped like any other.
"""

from __future__ import annotations

import hashlib
import json

from roll.agentic.env_manager.base import BaseEnvManager, EpisodeBuilder, MalformedEnvOutput
from roll.core.records import GenerateOutput, StepRecord


def chat_of(info: dict, tag: str) -> list[dict]:
    """`info["messages"]` checked: a list of {"role", "content": str} dicts, not empty."""
    messages = info.get("messages") if isinstance(info, dict) else None
    if not (
        isinstance(messages, list)
        and messages
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise MalformedEnvOutput(
            f"{tag}: a native env hands its chat out as info['messages'], a non-empty list of "
            "{'role', 'content'} dicts"
        )
    return messages


def chat_hash(messages: list[dict]) -> str:
    return hashlib.blake2b(json.dumps(messages, sort_keys=True).encode(), digest_size=8).hexdigest()


class NativeStepEnvManager(BaseEnvManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.messages: list[dict] = []  # the env's chat after its last reset or step

    async def _env_call(self, name: str, *args, **kwargs):
        result = await super()._env_call(name, *args, **kwargs)
        if name in ("reset", "step"):  # the chat the next prompt renders
            self.messages = chat_of(result[-1], self.spec.tag)
        return result

    def new_builder(self, instruction: str | None, observation: str) -> EpisodeBuilder:
        return _NativeStepBuilder(self, self.sequence_length - self.sampling.max_new_tokens)


class _NativeStepBuilder(EpisodeBuilder):
    def __init__(self, manager: NativeStepEnvManager, budget: int):
        self.manager, self.budget = manager, budget
        self.steps: list[StepRecord] = []
        self._prompt: list[int] = []
        self._state = ""

    def prompt(self) -> list[int] | None:
        chat = self.manager.chat
        messages = self.manager.messages
        self._prompt = chat.template_ids(messages, add_generation_prompt=True) + chat.prefix_ids
        self._state = chat_hash(messages)
        return self._prompt if len(self._prompt) <= self.budget else None

    def add_response(self, out: GenerateOutput, reward: float) -> None:
        self.steps.append(
            StepRecord(
                step=len(self.steps),
                prompt_ids=self._prompt,
                response_ids=list(out.token_ids),
                logprobs=list(out.logprobs),
                versions=list(out.token_versions),
                reward=reward,
                state_hash=self._state,
            )
        )

    def add_observation(self, observation: str, out: GenerateOutput, reward: float) -> None:
        pass  # the env has added the answer and the new state to its chat

    def sample_fields(self) -> dict:
        return {"steps": self.steps}
