"""Checks run by the CLI before Ray starts: what a validated config cannot tell by itself.

Config validation (pydantic) sees values only; these checks look at the world the values point
to, so they live here, at the edge, and not in the validators. Each failure is a `ConfigError`
naming the key (the CLI prints one line and exits 2), seconds before anything heavy starts:

- `output_dir`: a fresh run (`resume_from_checkpoint: false`) refuses a directory that holds
  another run's `metrics.jsonl` or checkpoints, unless `overwrite_output_dir: true` (which then
  deletes those two, so the runs cannot mix); resuming is the other way in.
- `output_dir`, `logging_dir`: can be created and written.
- `pretrain`, `reward_pretrain`, each role's `model_name_or_path`: the `config.json` parses
  (`AutoConfig`).
- `custom_envs.<tag>.env_config`: one env per tag in use is built and reset here, bounded by
  `ENV_CHECK_TIMEOUT_S` (the environment variable `ROLL_ENV_CHECK_TIMEOUT_S` overrides it), so a bad value is
  named now instead of as a dead env worker later.
- `sequence_length`: holds each tag's first prompt (the chat template of the env's instruction
  and first observation) plus `max_tokens_per_step`. Shorter, step-wise batches could not be
  built and trajectory-wise episodes ended before their first action (zero loss).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from roll.configs import ConfigError
from roll.pipeline import checkpoint as ckpt
from roll.pipeline.recorded_rollout import recording_path
from roll.tracking.tracker import METRICS_FILE

ENV_CHECK_TIMEOUT_S = 30.0


def run_preflight(cfg) -> None:
    """Every check above, in order; raises the first `ConfigError`."""
    check_output_dir(cfg)
    check_writable(cfg.output_dir, "output_dir")
    check_writable(cfg.logging_dir, "logging_dir")
    check_model_configs(cfg)
    check_envs(cfg)
    check_recordings(cfg)


def previous_run(output_dir: str) -> list[str]:
    """What of another run `output_dir` holds: its metrics.jsonl, its checkpoints."""
    found = []
    metrics = Path(output_dir) / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS_FILE)
    root = ckpt.checkpoint_root(output_dir)
    if root.is_dir() and any(root.glob("step_*")):
        found.append("checkpoints")
    return found


def check_output_dir(cfg) -> None:
    if cfg.resume_from_checkpoint not in (False, "", None):
        return
    found = previous_run(cfg.output_dir)
    if not found:
        return
    if not cfg.overwrite_output_dir:
        raise ConfigError(
            "output_dir",
            f"{cfg.output_dir} holds another run's {' and '.join(found)}; resume it "
            "with resume_from_checkpoint=true, choose another output_dir, or set "
            "overwrite_output_dir=true to delete them",
        )
    (Path(cfg.output_dir) / METRICS_FILE).unlink(missing_ok=True)
    shutil.rmtree(ckpt.checkpoint_root(cfg.output_dir), ignore_errors=True)


def check_writable(directory: str, key: str) -> None:
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".roll-write-check-"):
            pass
    except OSError as err:
        raise ConfigError(key, f"cannot write to {directory}: {err.strerror or err}") from None


def check_model_configs(cfg) -> None:
    from transformers import AutoConfig

    paths = {cfg.pretrain: "pretrain"}
    if cfg.reward_pretrain:
        paths.setdefault(cfg.reward_pretrain, "reward_pretrain")
    for role in ("actor_train", "actor_infer", "critic", "reference"):
        worker = getattr(cfg, role, None)
        if worker is not None:
            paths.setdefault(worker.model_args.model_name_or_path, f"{role}.model_args.model_name_or_path")
    for path, key in paths.items():
        try:
            AutoConfig.from_pretrained(path)
        except Exception as err:  # OSError, ValueError, JSONDecodeError...: all mean "not a model dir"
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            raise ConfigError(
                key, f"{path}/config.json cannot be loaded: {lines[0] if lines else type(err).__name__}"
            ) from None


def check_recordings(cfg) -> None:
    """`rollout_mock` mode "mock" replays a recording of every training step: the run's steps
    must all be there (validations are checked when they come)."""
    mock = cfg.rollout_mock
    if mock is None or not mock.replays:
        return
    missing = [
        step for step in range(1, cfg.max_steps + 1) if not recording_path(mock.dump_dir, "train", step).is_file()
    ]
    if missing:
        raise ConfigError(
            "rollout_mock.dump_dir",
            f"{mock.dump_dir} has no recording of training step "
            f"{missing[0]} ({recording_path(mock.dump_dir, 'train', missing[0])}); record the run "
            "first with rollout_mock.mode=dump",
        )


def check_envs(cfg) -> None:
    """Build and reset one env per tag in use (with a time bound), and check that
    `sequence_length` holds its first prompt and one response."""
    from roll.agentic.env_manager.chat import ChatFormatter
    from roll.agentic.env_manager.native_env_manager import MalformedEnvOutput, chat_of
    from roll.configs.dialect import NATIVE_ENV_MANAGERS
    from roll.models.loading import load_tokenizer

    tokenizer = load_tokenizer(cfg.actor_infer.model_args.model_name_or_path)
    tags = dict.fromkeys(t for m in cfg.env_managers.values() for t in m.tags)
    for tag in tags:
        env_cfg = cfg.custom_envs[tag]
        if env_cfg.env_type == "agent":  # dataset rows, checked by the agent registry
            continue
        obs, info = _first_observation(tag, env_cfg, cfg.seed)
        chat = ChatFormatter(tokenizer, env_cfg.response_prefix)
        if env_cfg.env_manager_cls in NATIVE_ENV_MANAGERS:  # the prompt is the env's own chat
            try:
                prompt = chat.template_ids(chat_of(info, tag), add_generation_prompt=True)
            except MalformedEnvOutput as err:
                raise ConfigError(
                    f"custom_envs.{tag}.env_manager_cls",
                    f"{err} after reset; {env_cfg.env_type!r} does not (use step or traj)",
                ) from None
        else:
            instruction = info.get("env_instruction") if env_cfg.instruction is None else env_cfg.instruction
            prompt = chat.initial_prompt(instruction, obs)
        need = len(prompt) + env_cfg.max_tokens_per_step
        if need > cfg.sequence_length:
            raise ConfigError(
                "sequence_length",
                f"{cfg.sequence_length} cannot hold {tag}'s first prompt "
                f"({len(prompt)} tokens) and one response (custom_envs.{tag}."
                f"max_tokens_per_step={env_cfg.max_tokens_per_step}); "
                f"use at least {need}",
            )


def _first_observation(tag: str, env_cfg, seed: int) -> tuple[str, dict]:
    """`make_env(...).reset(seed=...)` in a daemon thread, bounded by `ENV_CHECK_TIMEOUT_S` (an
    env that hangs is left behind; the CLI exits right after)."""
    from roll.agentic.env.registry import FAULT_INJECTION_KEY, make_env

    key = f"custom_envs.{tag}.env_config"
    config = {k: v for k, v in env_cfg.env_config.items() if k != FAULT_INJECTION_KEY}  # no injected faults here
    timeout_s = float(os.environ.get("ROLL_ENV_CHECK_TIMEOUT_S", ENV_CHECK_TIMEOUT_S))
    box: dict = {}

    def build() -> None:
        try:
            env = make_env(env_cfg.env_type, config)
            box["result"] = env.reset(seed=seed)
            env.close()
        except Exception as err:
            box["error"] = err

    thread = threading.Thread(target=build, daemon=True, name=f"preflight-{tag}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ConfigError(
            key, f"building and resetting one {env_cfg.env_type} env took over {timeout_s:g}s; check its sizes"
        )
    if "error" in box:
        err = box["error"]
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise ConfigError(key, lines[0] if lines else type(err).__name__)
    return box["result"]
