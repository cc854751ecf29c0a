"""Checks of the resources a config points to, run by the CLI before Ray starts: checkpoints,
output directories, model files, envs, tokenizer templates (what a validated config cannot tell).

Config validation (pydantic) sees values only; these checks look at the world the values point
to, so they live here, at the edge, and not in the validators. Each failure is a `ConfigError`
naming the key (the CLI prints one line and exits 2), seconds before anything heavy starts:

- `resume_from_checkpoint`: an explicit path is an intact checkpoint (its manifest); a run whose
  checkpoint is already at `max_steps` has nothing to train (`NothingToTrain`, exit 0).
- every directory the run writes (`roll.pipeline.checks.run_dirs`): writable, free of another run's
  outputs unless `overwrite_output_dir`, with room for one checkpoint.
- `pretrain`, `reward_pretrain`, each role's `model_name_or_path`: the `config.json` parses
  (`AutoConfig`); each role's `attn_implementation` is one transformers builds that model with.
- tokenizers: the engine's fits every built role's embedding (`vocab_size`), and a role whose
  model dir has a tokenizer of its own has the same vocabulary (docs/reliability.md).
- `custom_envs.<tag>.env_config`: one env per tag in use is built and reset here, bounded by
  `ENV_CHECK_TIMEOUT_S` (the environment variable `ROLL_ENV_CHECK_TIMEOUT_S` overrides it), so a
  bad value is named now instead of as a dead env worker later.
- `data_args.template` renders with the tokenizer; `stop_strings` are single tokens of it.
- a vision-language config (`roll.pipeline.checks.vision`): a VL model, image envs, the image limit.
- `sequence_length`: holds each tag's first prompt (the chat template of the env's instruction
  and first observation) plus `max_tokens_per_step`.
"""

from __future__ import annotations

import os
import threading

from roll.configs import ConfigError
from roll.core.errors import RollError
from roll.pipeline.checks.run_dirs import check_run_dirs
from roll.pipeline.checks.vision import check_vision
from roll.pipeline.phases import checkpoint as ckpt
from roll.pipeline.phases.recorded_rollout import recording_path

ENV_CHECK_TIMEOUT_S = 30.0


def check_resources(cfg) -> None:
    """Every check above, in order; raises the first `ConfigError` (or `NothingToTrain`)."""
    check_resume(cfg)
    check_run_dirs(cfg)
    check_model_configs(cfg)
    check_tokenizers(cfg)
    check_attention(cfg)
    check_envs(cfg)
    check_vision(cfg)
    check_recordings(cfg)


class NothingToTrain(RollError):
    """A resumed run whose checkpoint is already at `max_steps`: the CLI says so in one line and
    exits 0 without starting anything."""

    exit_code = 0
    prefix = ""


def check_resume(cfg) -> None:
    """`resume_from_checkpoint`: an explicit path must be an intact checkpoint (its manifest);
    `true` picks the newest intact one (warning about a dangling `latest` or damaged ones once,
    here). The checkpoint found is then pinned in `cfg.resume_from_checkpoint`, so the pipeline
    resumes from exactly it without hashing it again; none found (`true` on a new run) stays
    `true`. A checkpoint at or past `max_steps` raises `NothingToTrain`."""
    if cfg.rollout_only or cfg.resume_from_checkpoint in (False, "", None):
        return
    try:
        path = ckpt.resolve_resume(cfg.resume_from_checkpoint, cfg.checkpoint_dir)
    except ckpt.CheckpointDamaged as err:
        raise ConfigError("resume_from_checkpoint", str(err).removeprefix("resume_from_checkpoint: ")) from None
    if path is None:
        return
    try:
        step = int(ckpt.read_state(path)["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError("resume_from_checkpoint", f"{path}/{ckpt.STATE_FILE} is unreadable: {err}") from None
    if step >= cfg.max_steps:
        raise NothingToTrain(
            f"nothing to train: {path} is at step {step} and max_steps is {cfg.max_steps}; raise max_steps to go on"
        )
    cfg.resume_from_checkpoint = str(path)


def check_attention(cfg) -> None:
    """Each built role's `attn_implementation` as transformers takes it for that model: the model
    is built on the meta device (no weights, no memory) with it. A name transformers does not know,
    or a kernel whose package is missing, is named now instead of as a dead worker later."""
    roles = {role: w for role, w in cfg.built_roles.items() if w.model_args.attn_implementation is not None}
    if not roles:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from roll.models.loading import resolve_attention

    for role, worker in roles.items():
        device = "cuda" if worker.device_mapping else "cpu"
        name = resolve_attention(worker.model_args.attn_implementation, device)
        try:
            config = AutoConfig.from_pretrained(worker.model_args.model_name_or_path)
            with torch.device("meta"):
                vision = getattr(config, "vision_config", None) is not None  # built as load_policy builds it
                auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
                auto.from_config(config, attn_implementation=name)
        except (ValueError, ImportError, OSError) as err:
            raise ConfigError(f"{role}.model_args.attn_implementation", _first_line(err)) from None


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


def check_tokenizers(cfg) -> None:
    """See the module docstring: the engine's tokenizer against each built role's embedding size
    and, where the role's dir has one, its tokenizer. Both paths are named."""
    from transformers import AutoConfig

    from roll.models.loading import load_tokenizer

    engine_path = cfg.actor_infer.model_args.model_name_or_path
    engine_vocab = load_tokenizer(engine_path).get_vocab()
    for role, worker in cfg.built_roles.items():
        path, key = worker.model_args.model_name_or_path, f"{role}.model_args.model_name_or_path"
        config = AutoConfig.from_pretrained(path)
        embedded = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", 0)
        if embedded and len(engine_vocab) > embedded:
            raise ConfigError(
                key,
                f"{path} embeds {embedded} tokens (its config.json vocab_size) but the engine's tokenizer "
                f"(actor_infer.model_args.model_name_or_path: {engine_path}) has {len(engine_vocab)}; "
                "give every role the tokenizer its model was trained with",
            )
        if path == engine_path or not _has_tokenizer(path):
            continue
        vocab = load_tokenizer(path).get_vocab()
        if vocab != engine_vocab:
            raise ConfigError(
                key, f"{path}'s tokenizer differs from the engine's ({engine_path}): {_vocab_gap(vocab, engine_vocab)}"
            )


def _has_tokenizer(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, name)) for name in ("tokenizer.json", "tokenizer_config.json"))


def _vocab_gap(vocab: dict[str, int], engine_vocab: dict[str, int]) -> str:
    """How two vocabularies differ, in a few words: their sizes, or the first id they disagree on."""
    if len(vocab) != len(engine_vocab):
        return f"{len(vocab)} tokens against the engine's {len(engine_vocab)}"
    by_id, engine_by_id = {i: t for t, i in vocab.items()}, {i: t for t, i in engine_vocab.items()}
    first = min(i for i in set(by_id) | set(engine_by_id) if by_id.get(i) != engine_by_id.get(i))
    return f"id {first} is {by_id.get(first)!r} here and {engine_by_id.get(first)!r} to the engine"


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
    from roll.configs.roll_compat.dialect import NATIVE_ENV_MANAGERS, VL_ENV_MANAGERS
    from roll.models.loading import load_tokenizer
    from roll.models.templates import apply_template

    tokenizer = apply_template(
        load_tokenizer(cfg.actor_infer.model_args.model_name_or_path), cfg.actor_infer.data_args.template
    )
    check_stop_strings(cfg, tokenizer)
    tags = dict.fromkeys(t for m in cfg.env_managers.values() for t in m.tags)
    for tag in tags:
        env_cfg = cfg.custom_envs[tag]
        if env_cfg.env_type == "agent":  # dataset rows, checked by the agent registry
            continue
        obs, info = _first_observation(tag, env_cfg, cfg.seed)
        if env_cfg.env_manager_cls in VL_ENV_MANAGERS:  # its prompt holds images: vl_checks measures it
            continue
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


def check_stop_strings(cfg, tokenizer) -> None:
    """Each manager's `stop_strings` must be single tokens of the run's tokenizer (what the engines
    stop on); the key named is where the manager's sampling settings come from."""
    from roll.pipeline.setup.rollout_builders import sampling_params

    for name, manager in cfg.env_managers.items():
        override = manager.generating_args
        where = name if override is not None and "stop_strings" in override.model_fields_set else "actor_infer"
        try:
            sampling_params(cfg.generating_args_for(manager), tokenizer)
        except ValueError as err:
            raise ConfigError(f"{where}.generating_args.stop_strings", str(err).split(": ", 1)[-1]) from None


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


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

    thread = threading.Thread(target=build, daemon=True, name=f"env-check-{tag}")
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
