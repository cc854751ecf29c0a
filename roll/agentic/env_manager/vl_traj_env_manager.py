"""Trajectory-wise env manager for vision-language models (ROLL's `VLTrajEnvManager`).

One sample per episode, as `TrajEnvManager`, but every observation is the env's `rgb_array` frame
shown as an image. The turns are laid out as ROLL lays them out: a system message
(`agent_system_template`), then per turn one user message of three parts: text
(`pre_step_template`, after the env's instruction on the first turn), the image, text
(`next_step_template`).

The model's own processor makes the ids: it renders the first prompt (image placeholders widened
to one id per merged patch) and each later user turn, cut from a probe conversation after the
assistant turn exactly as `roll.models.chat_template.continuation_ids` does for text, so the
generated ids are kept as sampled and past turns are never re-rendered. The episode's images
travel with every generate request (`GenerateRequest.images`: all images of the prompt so far, and
their raw frames for an engine that takes those, `vl_prompts.request_images`) and with the
trajectory (`Trajectory.images`), so the trainer scores the very ids and images the engine saw.
Requests carry the episode's session id (its traj_id), so an engine may keep the episode's KV
between turns; the `hf` engine reuses it only up to the first image that differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roll.agentic.env_manager.base import EpisodeBuilder
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.env_manager.vl_prompts import (  # noqa: F401 (the templates and errors: re-exported)
    NEXT_STEP_TEMPLATE,
    PRE_STEP_TEMPLATE,
    ImageObservationError,
    TooManyImages,
    render_frame,
    request_images,
    require_frames,
    turn_texts,
    user_content,
)
from roll.agentic.episode import EnvSpec, TokenLedger
from roll.agentic.generation import GenerateFn, generate_within
from roll.core.records import GenerateOutput, GenerateRequest, ImageInputs, SamplingParams
from roll.models.chat_template import render_text

_PROBE_ANSWER = "ROLL_PROBE_ANSWER"


class VLTrajEnvManager(TrajEnvManager):
    reuse_kv_across_turns = True  # every prompt extends the last; the engine checks the images too

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
        max_images_per_prompt: int | None = None,
    ):
        super().__init__(
            spec, processor.tokenizer, generate, sampling, sequence_length, step_timeout_s, generate_timeout_s
        )
        require_frames(self.env, spec.tag)
        self.processor = processor
        self.max_images_per_prompt = max_images_per_prompt
        self._builder: VLConversationBuilder | None = None

    def new_builder(self, instruction: str | None, observation: str) -> VLConversationBuilder:
        spec = self.spec
        self._builder = VLConversationBuilder(
            self.processor,
            self.chat,
            spec.agent_system_template,
            lambda turn: turn_texts(spec, instruction, turn, with_instruction=turn == 0),
            render_frame(self.env),
            self.sampling.max_new_tokens,
            self.sequence_length,
            lambda: render_frame(self.env),
            self.max_images_per_prompt,
        )
        return self._builder

    async def generate(
        self, request_id: str, prompt_ids: list[int], seed: int, session_id: str | None = None
    ) -> GenerateOutput:
        """A turn's generation with every image of its prompt."""
        builder = self._builder
        assert builder is not None  # new_builder made it before the episode's first generate
        images = request_images(builder.images(), builder.frames, self.spec.send_frames)
        request = GenerateRequest(request_id, list(prompt_ids), self.episode_sampling, seed, session_id, images)
        return await generate_within(self._generate, request, self.generate_timeout_s)


class VLConversationBuilder(EpisodeBuilder):
    """The episode as one growing conversation of ids (a `TokenLedger`) and its images."""

    def __init__(
        self,
        processor,
        chat: ChatFormatter,
        system: str | None,
        turn_texts,
        first_image: np.ndarray,
        max_new_tokens: int,
        sequence_length: int,
        render,
        max_images: int | None,
    ):
        self.processor = processor
        self.chat = chat
        self.turn_texts = turn_texts  # turn -> (text before the image, text after it)
        self.render = render  # the env's current frame, an (H, W, 3) uint8 image
        self.max_images = max_images
        self.budget = sequence_length - max_new_tokens
        self.pixel_values: list[torch.Tensor] = []
        self.grids: list[list[int]] = []
        self.frames: list[np.ndarray] = []  # the images themselves, in prompt order
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user_content(*turn_texts(0))})
        text = render_text(processor, messages, add_generation_prompt=True) + chat.response_prefix
        self.ledger = TokenLedger(self._encode(text, first_image))

    def _encode(self, text: str, image: np.ndarray) -> list[int]:
        """`text` (holding one image placeholder) as the processor's ids; keeps the image's inputs."""
        if self.max_images is not None and len(self.grids) + 1 > self.max_images:
            raise TooManyImages(
                f"a prompt would carry {len(self.grids) + 1} images, over the limit of {self.max_images} "
                "(actor_infer.strategy_args.strategy_config.limit_mm_per_prompt.image)"
            )
        out = self.processor(text=[text], images=[image], return_tensors="pt")
        self.pixel_values.append(out["pixel_values"])
        self.grids += out["image_grid_thw"].tolist()
        self.frames.append(image)
        return out["input_ids"][0].tolist()

    def images(self) -> ImageInputs:
        return ImageInputs(torch.cat(self.pixel_values), [list(g) for g in self.grids])

    def prompt(self) -> list[int] | None:
        return self.ledger.token_ids if len(self.ledger.token_ids) <= self.budget else None

    def add_response(self, out: GenerateOutput, reward: float) -> None:
        self.ledger.add_turn(out)

    def add_observation(self, observation: str, out: GenerateOutput, reward: float) -> None:
        """The next user turn (text, the env's current frame, text), cut from a probe conversation
        right after the assistant turn; the end-of-turn id is dropped if the model emitted it."""
        message = {"role": "user", "content": user_content(*self.turn_texts(self.ledger.num_turns))}
        probe: list[dict[str, Any]] = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PROBE_ANSWER},
            message,
        ]
        text = render_text(self.processor, probe, add_generation_prompt=True)
        ids = self._encode(text[text.index(_PROBE_ANSWER) + len(_PROBE_ANSWER) :], self.render())
        if out.token_ids and ids and out.token_ids[-1] == ids[0] == self.chat.eos_token_id:
            ids = ids[1:]
        self.ledger.add_context(ids + self.chat.prefix_ids)

    def sample_fields(self) -> dict:
        return self.ledger.sample_fields() | {"images": self.images()}
