"""Warm start: teach a model an env's action format by imitation, before RL.

A model trained from scratch on WebShop never writes a valid `search[...]` / `click[...]` by chance
(the tiny example: 0 valid actions in 60 steps, every episode -0.8, so GRPO's groups carry no
signal). RL needs a policy that already acts; a real pretrained model brings one, the tiny model
gets one here. The teacher is the env's `sample_valid_action`: a uniformly random action the page
accepts (the format, no preference among moves), or another `sample_*_action(rng)` method of the
env (`--teacher`, e.g. WebShop's `sample_shopper_action`), optionally mixed with the env's oracle
`scripted_action` (`--expert_prob`). It plays through the experiment's own env manager, standing in
for the inference engine, so every sample is laid out exactly as RL's will be (chat template,
instruction, response prefix, agent templates, step-wise prompts); the model is trained with cross
entropy on the teacher's answer tokens only and saved as a HF model dir for `pretrain`.

    python -m roll.pipeline.warm_start --config_path webshop --config_name agent_val_webshop \
        --output_dir ./output/models/tiny-webshop-warm pretrain=./output/models/tiny-webshop

The model it starts from is the config's `pretrain`; the env is the first tag of
`train_env_manager` (or `--tag`); hydra overrides work as in `start_agentic_pipeline.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from roll.agentic.env import TextEnv
from roll.agentic.env_manager.factory import make_env_manager
from roll.agentic.episode import EpisodeSpec
from roll.configs import ConfigError, load_config
from roll.core.records import GenerateOutput, Trajectory
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.templates import apply_template

logger = logging.getLogger("roll")


class Teacher:
    """The engine's stand-in: answers each request with the env's `method` (default its random
    valid action; or, with chance `expert_prob`, its scripted one), as the ids the model should
    have generated."""

    def __init__(
        self,
        tokenizer,
        response_prefix: str,
        rng: np.random.Generator,
        expert_prob: float = 0.0,
        method: str = "sample_valid_action",
    ):
        self.tokenizer, self.prefix, self.rng, self.expert_prob = tokenizer, response_prefix, rng, expert_prob
        self.method = method
        self.env: TextEnv | None = None  # the unwrapped env of the manager being played

    async def generate(self, request) -> GenerateOutput:
        env = self.env
        assert env is not None  # teacher_samples sets it before the first episode
        answer = env.scripted_action() if self.expert_prob and self.rng.random() < self.expert_prob else None
        answer = answer or getattr(env, self.method)(self.rng)
        if answer is None:
            raise ValueError(
                f"{type(self.env).__name__} has no teacher: {self.method} returned None "
                "while the episode was still running"
            )
        ids = self.tokenizer.encode(answer.removeprefix(self.prefix), add_special_tokens=False)
        return GenerateOutput(request.request_id, ids, [0.0] * len(ids), "stop", 0)


def samples_of(traj: Trajectory) -> list[dict]:
    """A played episode's training sequences with their answer masks: the conversation
    (trajectory-wise) or one prompt + answer per step (step-wise)."""
    if traj.steps:
        return [
            {
                "token_ids": list(s.prompt_ids) + list(s.response_ids),
                "response_mask": [0] * len(s.prompt_ids) + [1] * len(s.response_ids),
            }
            for s in traj.steps
        ]
    return [{"token_ids": list(traj.token_ids), "response_mask": list(traj.response_mask)}]


def teacher_samples(manager, teacher: Teacher, seeds: Sequence[int]) -> list[dict]:
    """Play one teacher episode per env seed through `manager`; their training sequences."""
    teacher.env = manager.env.unwrapped

    async def play() -> list[dict]:
        out = []
        for seed in seeds:
            traj = await manager.run_episode(EpisodeSpec(f"warm/{seed}", f"warm/{seed}/0", seed, seed))
            out += samples_of(traj)
        return out

    try:
        return asyncio.run(play())
    finally:
        manager.close()


def batch_tensors(samples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask` and `labels` (-100 outside the answers)."""
    width = max(len(s["token_ids"]) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    labels = torch.full((len(samples), width), -100, dtype=torch.long)
    for row, s in enumerate(samples):
        n = len(s["token_ids"])
        ids[row, :n] = torch.tensor(s["token_ids"])
        attention[row, :n] = 1
        mask = torch.tensor(s["response_mask"], dtype=torch.bool)
        labels[row, :n] = torch.where(mask, ids[row, :n], torch.tensor(-100))
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def train(
    model, samples: list[dict], *, steps: int, batch_size: int, lr: float, seed: int, pad_id: int, log_every: int = 50
) -> list[float]:
    """`steps` AdamW steps of answer-token cross entropy over shuffled `samples`; the losses."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.train()
    losses: list[float] = []
    order: list[int] = []
    for step in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(samples), generator=generator).tolist()
        batch, order = [samples[i] for i in order[:batch_size]], order[batch_size:]
        loss = model(**batch_tensors(batch, pad_id)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            logger.info("warm start step %d/%d: answer loss %.4f", step + 1, steps, losses[-1])
    model.eval()
    return losses


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m roll.pipeline.warm_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config_path", required=True, help="directory of the experiment's YAML")
    parser.add_argument("--config_name", required=True, help="YAML file name, without .yaml")
    parser.add_argument("--output_dir", required=True, help="where the warm-started model is saved")
    parser.add_argument("--tag", default=None, help="the env tag (default: train_env_manager's first)")
    parser.add_argument("--episodes", type=int, default=1024, help="teacher episodes (env seeds 0..N-1)")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--expert_prob",
        type=float,
        default=0.0,
        help="chance per turn of the env's scripted_action instead of a random valid one",
    )
    parser.add_argument(
        "--teacher",
        default="sample_valid_action",
        help="the env's method that answers each turn, sample_*_action(rng) (default: its random valid action)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. pretrain=DIR")
    args = parser.parse_intermixed_args(argv)
    if not 0.0 <= args.expert_prob <= 1.0:
        parser.error(f"--expert_prob must be in [0, 1], got {args.expert_prob}")
    if not (args.teacher.startswith("sample_") and args.teacher.endswith("_action")):
        parser.error(f"--teacher must name an env method sample_*_action, got {args.teacher!r}")
    for name in ("episodes", "steps", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def _teacher_setup(args: argparse.Namespace):
    """(config, tag, env spec) of the experiment; a ConfigError names what is wrong."""
    from roll.configs.command_line import resolve_config_dir  # the CLIs' lookup: as given, or under examples/
    from roll.pipeline.checks.config import check_before_start
    from roll.pipeline.setup.rollout_builders import env_spec

    examples = str(Path(__file__).resolve().parents[2] / "examples")
    cfg = load_config(resolve_config_dir(args.config_path, examples), args.config_name, args.overrides)
    check_before_start(cfg)
    manager_cfg = cfg.train_env_manager
    tag = args.tag or manager_cfg.tags[0]
    if tag not in cfg.custom_envs:
        raise ConfigError("--tag", f"{tag!r} is not under custom_envs ({', '.join(cfg.custom_envs)})")
    if cfg.custom_envs[tag].env_type == "agent":
        raise ConfigError("--tag", f"{tag!r} is an agent dataset (env_type agent): no env teacher")
    return cfg, tag, env_spec(cfg, tag, manager_cfg)


def _teacher_manager(cfg, spec, tokenizer, teacher: Teacher):
    """The experiment's env manager with `teacher` as its engine; exits 2 when the env has no
    method `teacher.method`."""
    from roll.pipeline.setup.rollout_builders import sampling_params

    manager_cfg = cfg.train_env_manager
    manager = make_env_manager(
        spec,
        tokenizer,
        teacher.generate,
        sampling_params(cfg.generating_args_for(manager_cfg), tokenizer),
        cfg.sequence_length,
        mode=manager_cfg.env_manager_type,
        history_length=manager_cfg.history_length,
        step_timeout_s=None,
        generate_timeout_s=None,
    )
    if not callable(getattr(manager.env.unwrapped, teacher.method, None)):
        manager.close()
        print(
            f"config error: --teacher: {type(manager.env.unwrapped).__name__} has no method {teacher.method}",
            file=sys.stderr,
        )
        sys.exit(2)
    return manager


def main(argv: Sequence[str] | None = None) -> str:
    args = _parse_args(argv)
    try:
        cfg, tag, spec = _teacher_setup(args)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    torch.manual_seed(args.seed)
    tokenizer = apply_template(load_tokenizer(cfg.pretrain), cfg.actor_infer.data_args.template)
    teacher = Teacher(tokenizer, spec.response_prefix, np.random.default_rng(args.seed), args.expert_prob, args.teacher)
    manager = _teacher_manager(cfg, spec, tokenizer, teacher)
    try:
        samples = teacher_samples(manager, teacher, range(args.episodes))
    except ValueError as err:
        sys.exit(f"python -m roll.pipeline.warm_start: {err}")
    answers = sum(sum(s["response_mask"]) for s in samples)
    logger.info(
        "warm start on %s: %d teacher episodes, %d sequences, %d answer tokens",
        tag,
        args.episodes,
        len(samples),
        answers,
    )
    model = load_causal_lm(cfg.pretrain)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses = train(
        model, samples, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, pad_id=pad_id
    )
    out = Path(args.output_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {
        "pretrain": cfg.pretrain,
        "tag": tag,
        "env_type": spec.env_type,
        "episodes": args.episodes,
        "steps": args.steps,
        "expert_prob": args.expert_prob,
        "teacher": args.teacher,
        "first_loss": losses[0],
        "last_loss": sum(losses[-10:]) / len(losses[-10:]),
    }
    (out / "warm_start.json").write_text(json.dumps(record, indent=1))
    print(out)
    return str(out)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
