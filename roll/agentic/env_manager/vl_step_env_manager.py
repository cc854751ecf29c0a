"""Step-wise env manager for vision-language models: one training sample per env step, its state
shown as the env's `rgb_array` frame (GiGPO on images; ROLL has no step-wise VL manager).

Each step's prompt is built afresh as one chat, laid out as the trajectory-wise VL manager lays
out its turns (`vl_prompts.turn_texts`: `agent_system_template`, then per turn `pre_step_template`,
the frame, `next_step_template`; the instruction opens the first turn shown): the last
`history_length` steps as user turns with their frames and the answers the model gave (the
env-parsed text: `response_prefix` and the generated text) as assistant turns, then the current
turn with the current frame. History 0: the current frame alone. A prompt so holds
`min(history_length, step) + 1` images.

The model's own processor makes the ids and pixel values of the whole prompt, exactly as the VL
trajectory manager makes its first prompt (the two agree on a history-free step); the generated
ids are kept as sampled. Each step sample carries its prompt's images (`StepRecord.images`: what
its generate request carried, less the raw frames sent to an engine that takes them,
`vl_prompts.request_images`) and the hash of its current frame (`vl_prompts.frame_hash`): steps
showing equal frames share a hash, which is what GiGPO groups as anchor states. The hash is of
the current frame only, not of the history shown, as the text step manager hashes only the
current observation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from roll.agentic.env_manager.base import BaseEnvManager, EpisodeBuilder
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.env_manager.vl_prompts import (
    check_image_count,
    frame_hash,
    render_frame,
    request_images,
    require_frames,
    turn_texts,
    user_content,
)
from roll.agentic.episode import EnvSpec
from roll.agentic.generation import GenerateFn, generate_within
from roll.core.records import GenerateOutput, GenerateRequest, ImageInputs, SamplingParams, StepRecord
from roll.models.chat_template import render_text


class VLStepEnvManager(BaseEnvManager):
    reuse_kv_across_turns = False  # every prompt is built afresh

    def __init__(
        self,
        spec: EnvSpec,
        processor,
        generate: GenerateFn,
        sampling: SamplingParams,
        sequence_length: int,
        step_timeout_s: float | None = 60.0,
        generate_timeout_s: float | None = 300.0,
        *,
        history_length: int = 0,
        max_images_per_prompt: int | None = None,
    ):
        super().__init__(
            spec, processor.tokenizer, generate, sampling, sequence_length, step_timeout_s, generate_timeout_s
        )
        require_frames(self.env, spec.tag)
        self.processor = processor
        self.history_length = history_length
        self.max_images_per_prompt = max_images_per_prompt
        self._builder: VLStepBuilder | None = None

    def new_builder(self, instruction: str | None, observation: str) -> EpisodeBuilder:
        spec = self.spec
        self._builder = VLStepBuilder(
            self.processor,
            self.chat,
            spec.agent_system_template,
            lambda turn, first: turn_texts(spec, instruction, turn, with_instruction=first),
            lambda: render_frame(self.env),
            self.history_length,
            self.sequence_length - self.sampling.max_new_tokens,
            self.max_images_per_prompt,
        )
        return self._builder

    async def generate(
        self, request_id: str, prompt_ids: list[int], seed: int, session_id: str | None = None
    ) -> GenerateOutput:
        """A step's generation with the images of its prompt."""
        builder = self._builder
        assert builder is not None and builder.images is not None  # the step's prompt() made them
        images = request_images(builder.images, builder.frames, self.spec.send_frames)
        request = GenerateRequest(request_id, list(prompt_ids), self.episode_sampling, seed, images=images)
        return await generate_within(self._generate, request, self.generate_timeout_s)


class VLStepBuilder(EpisodeBuilder):
    """The episode as step samples: each prompt rendered afresh from the last `history_length`
    (frame, answer) pairs and the env's current frame."""

    def __init__(
        self,
        processor,
        chat: ChatFormatter,
        system: str | None,
        turn_texts: Callable[[int, bool], tuple[str, str]],
        render: Callable[[], np.ndarray],
        history_length: int,
        budget: int,
        max_images: int | None,
    ):
        self.processor = processor
        self.chat = chat
        self.system = [{"role": "system", "content": system}] if system else []
        self.turn_texts = turn_texts  # (turn, first turn shown) -> (text before the image, text after it)
        self.render = render  # the env's current frame, an (H, W, 3) uint8 image
        self.history_length = history_length
        self.budget = budget
        self.max_images = max_images
        self.history: list[tuple[np.ndarray, str]] = []  # (frame, answer text) of the shown earlier steps
        self.steps: list[StepRecord] = []
        self.prompt_ids: list[int] = []
        self.images: ImageInputs | None = None  # the current prompt's
        self.frames: list[np.ndarray] = []  # the current prompt's images themselves
        self.frame: np.ndarray | None = None  # the current step's

    def prompt(self) -> list[int] | None:
        turn, self.frame = len(self.steps), self.render()
        first = turn - len(self.history)  # the first turn shown
        messages: list[dict[str, Any]] = list(self.system)
        frames: list[np.ndarray] = []
        for k, (frame, answer) in enumerate(self.history):
            messages.append({"role": "user", "content": user_content(*self.turn_texts(first + k, k == 0))})
            messages.append({"role": "assistant", "content": answer})
            frames.append(frame)
        messages.append({"role": "user", "content": user_content(*self.turn_texts(turn, not self.history))})
        frames.append(self.frame)
        check_image_count(len(frames), self.max_images)
        text = render_text(self.processor, messages, add_generation_prompt=True) + self.chat.response_prefix
        out = self.processor(text=[text], images=frames, return_tensors="pt")
        self.prompt_ids = out["input_ids"][0].tolist()
        self.images = ImageInputs(out["pixel_values"], out["image_grid_thw"].tolist())
        self.frames = frames
        return self.prompt_ids if len(self.prompt_ids) <= self.budget else None

    def add_response(self, out: GenerateOutput, reward: float) -> None:
        assert self.frame is not None  # the step's prompt() rendered it
        self.steps.append(
            StepRecord(
                step=len(self.steps),
                prompt_ids=self.prompt_ids,
                response_ids=list(out.token_ids),
                logprobs=list(out.logprobs),
                versions=list(out.token_versions),
                reward=reward,
                state_hash=frame_hash(self.frame),
                images=self.images,
            )
        )

    def add_observation(self, observation: str, out: GenerateOutput, reward: float) -> None:
        """The step just played joins the history window (the frame is the env's, not `observation`)."""
        if self.history_length and self.frame is not None:
            self.history = [*self.history, (self.frame, self.chat.response_text(out.token_ids))]
            self.history = self.history[-self.history_length :]

    def sample_fields(self) -> dict:
        return {"steps": self.steps}
