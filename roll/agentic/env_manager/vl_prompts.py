"""What the vision-language env managers share: the trajectory-wise one (`vl_traj_env_manager`)
and the step-wise one (`vl_step_env_manager`).

- ROLL's turn templates and the text around each turn's image (`turn_texts`): a user turn is text
  (`pre_step_template`, after the instruction when it is the first turn shown), the image, text
  (`next_step_template`), as ROLL's `VLTrajEnvManager` lays it out;
- the check that the env gives frames (`require_frames`) and the engine's per-prompt image limit
  (`check_image_count`);
- `frame_hash`: the state hash of a frame, equal exactly when two frames are equal (the anchor
  states of GiGPO);
- `request_images`: a prompt's images as its generate request carries them, with the raw frames
  only for an engine that runs the model's processor itself (`EnvSpec.send_frames`: vllm); the
  samples never carry frames (the trainer uses the processor's `pixel_values`).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from roll.agentic.episode import EnvSpec
from roll.core.records import ImageInputs

# ROLL's defaults (its vl_traj_envs.yaml)
PRE_STEP_TEMPLATE = "\nTurn {turn_idx}:\nState:\n"
NEXT_STEP_TEMPLATE = (
    "You have {actions_left} actions left. Always output: <answer> [your answer] </answer> with no extra text. "
    "Strictly follow this format. Max response length: {max_response_length} words (tokens).\nDecide the next action:\n"
)


class ImageObservationError(ValueError):
    """An env under a VL manager does not give images (its `render_mode` is not "rgb_array")."""


class TooManyImages(ValueError):
    """A prompt would carry more images than the inference engine's per-prompt limit."""


def user_content(text_before: str, text_after: str) -> list[dict]:
    """One user turn: text, the image, text (as ROLL's VL manager builds it)."""
    return [{"type": "text", "text": text_before}, {"type": "image"}, {"type": "text", "text": text_after}]


def turn_texts(spec: EnvSpec, instruction: str | None, turn: int, with_instruction: bool) -> tuple[str, str]:
    """(text before the image, text after it) of 0-based turn `turn`; the instruction (if any)
    opens the text of the first turn a prompt shows (`with_instruction`)."""
    pre = spec.pre_step_template if spec.pre_step_template is not None else PRE_STEP_TEMPLATE
    nxt = spec.next_step_template if spec.next_step_template is not None else NEXT_STEP_TEMPLATE
    before = pre.format(turn_idx=turn + 1)
    if with_instruction and instruction:
        before = instruction + before
    after = nxt.format(actions_left=spec.max_steps - turn, max_response_length=spec.max_tokens_per_step)
    return before, after


def require_frames(env, tag: str) -> None:
    """`ImageObservationError` naming the key unless `env` renders "rgb_array" frames."""
    mode = getattr(env, "render_mode", None)
    if mode != "rgb_array":
        raise ImageObservationError(
            f"custom_envs.{tag}.env_config.render_mode: the VL env manager needs image observations "
            f'(render_mode: "rgb_array"), got {mode!r}'
        )


def render_frame(env) -> np.ndarray:
    """`env`'s current frame, an (H, W, 3) uint8 image (`require_frames` checked its render mode)."""
    frame = env.render()
    if not isinstance(frame, np.ndarray):
        raise ImageObservationError(f"{type(env).__name__}.render() gave {type(frame).__name__}, not an image")
    return frame


def check_image_count(count: int, limit: int | None) -> None:
    """`TooManyImages` when a prompt of `count` images is over the engine's `limit` (None: none)."""
    if limit is not None and count > limit:
        raise TooManyImages(
            f"a prompt would carry {count} images, over the limit of {limit} "
            "(actor_infer.strategy_args.strategy_config.limit_mm_per_prompt.image)"
        )


def frame_hash(frame: np.ndarray) -> str:
    """A state hash of a frame: blake2b of its shape, dtype and bytes, so equal frames (equal
    pixels) share a hash and different ones do not."""
    frame = np.ascontiguousarray(frame)
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{frame.shape}{frame.dtype.str}".encode())
    digest.update(frame.tobytes())
    return digest.hexdigest()


def request_images(images: ImageInputs, frames: list[np.ndarray], send_frames: bool) -> ImageInputs:
    """`images` with `frames` (the same images before the processor, in prompt order) when the
    engine takes them (`send_frames`), else `images` itself."""
    if not send_frames:
        return images
    if len(frames) != images.num_images:
        raise ValueError(f"{len(frames)} frames for a prompt of {images.num_images} images")
    return dataclasses.replace(images, frames=list(frames))
