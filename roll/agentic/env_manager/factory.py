"""The env manager of one env tag by sample mode: the one choice the env workers and the warm start
(`roll.pipeline.warm_start`, which plays a teacher through the same managers) both make."""

from __future__ import annotations

from roll.agentic.env_manager.base import EnvSpec, GenerateFn
from roll.agentic.env_manager.native_env_manager import NativeStepEnvManager
from roll.agentic.env_manager.step_env_manager import StepEnvManager
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.env_manager.vl_step_env_manager import VLStepEnvManager
from roll.agentic.env_manager.vl_traj_env_manager import VLTrajEnvManager
from roll.core.enums import SampleMode
from roll.core.records import SamplingParams


def make_env_manager(
    spec: EnvSpec,
    tokenizer,
    generate: GenerateFn,
    sampling: SamplingParams,
    sequence_length: int,
    *,
    mode: SampleMode,
    history_length: int,
    step_timeout_s: float | None = 60.0,
    generate_timeout_s: float | None = 300.0,
) -> TrajEnvManager | StepEnvManager:
    """Trajectory-wise, step-wise, or step-wise on the env's own chat (`spec.native_chat`);
    `history_length` is the manager's, which a tag's own `spec.history_length` overrides."""
    args = (spec, tokenizer, generate, sampling, sequence_length, step_timeout_s, generate_timeout_s)
    if mode == SampleMode.STEP and spec.native_chat:
        return NativeStepEnvManager(*args)
    if mode == SampleMode.STEP:
        return StepEnvManager(
            *args, history_length=history_length if spec.history_length is None else spec.history_length
        )
    return TrajEnvManager(*args)


def make_vl_env_manager(
    spec: EnvSpec,
    processor,
    generate: GenerateFn,
    sampling: SamplingParams,
    sequence_length: int,
    *,
    mode: SampleMode,
    history_length: int,
    step_timeout_s: float | None = 60.0,
    generate_timeout_s: float | None = 300.0,
) -> VLTrajEnvManager | VLStepEnvManager:
    """A tag with image observations (`spec.vision`), played with the model's `processor`:
    trajectory- or step-wise by `mode`, as `make_env_manager` chooses for text."""
    args = (spec, processor, generate, sampling, sequence_length, step_timeout_s, generate_timeout_s)
    if mode == SampleMode.STEP:
        return VLStepEnvManager(
            *args,
            history_length=history_length if spec.history_length is None else spec.history_length,
            max_images_per_prompt=spec.max_images_per_prompt,
        )
    return VLTrajEnvManager(*args, max_images_per_prompt=spec.max_images_per_prompt)
