"""The env manager of one env tag by sample mode: the one choice the env workers and the warm start
(`roll.pipeline.warm_start`, which plays a teacher through the same managers) both make."""

from __future__ import annotations

from roll.agentic.env_manager.native_env_manager import NativeStepEnvManager
from roll.agentic.env_manager.step_env_manager import StepEnvManager
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.env_manager.vl_step_env_manager import VLStepEnvManager
from roll.agentic.env_manager.vl_traj_env_manager import VLTrajEnvManager
from roll.agentic.episode import EnvSpec
from roll.agentic.generation import GenerateFn
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
    processor=None,
) -> TrajEnvManager | StepEnvManager | NativeStepEnvManager | VLTrajEnvManager | VLStepEnvManager:
    """Trajectory-wise or step-wise by `mode`; step-wise on the env's own chat
    (`spec.native_chat`); for a tag with image observations (`spec.vision`) the VL managers, whose
    prompts the model's `processor` makes. `history_length` is the manager's, which a tag's own
    `spec.history_length` overrides."""
    history = history_length if spec.history_length is None else spec.history_length
    timeouts = (step_timeout_s, generate_timeout_s)
    if spec.vision:
        if processor is None:
            raise ValueError(f"custom_envs.{spec.tag} has image observations: its manager needs the model's processor")
        args = (spec, processor, generate, sampling, sequence_length, *timeouts)
        if mode == SampleMode.STEP:
            return VLStepEnvManager(*args, history_length=history, max_images_per_prompt=spec.max_images_per_prompt)
        return VLTrajEnvManager(*args, max_images_per_prompt=spec.max_images_per_prompt)
    args = (spec, tokenizer, generate, sampling, sequence_length, *timeouts)
    if mode == SampleMode.STEP and spec.native_chat:
        return NativeStepEnvManager(*args)
    if mode == SampleMode.STEP:
        return StepEnvManager(*args, history_length=history)
    return TrajEnvManager(*args)
