"""ROLL features that roll deliberately does not run, refused by name before validation.

A ROLL config for one of these would otherwise fail on whichever of its other keys pydantic
reports first (a sandbox config on its chat template, a DeepEyes config on its env keys), which
names a symptom. `refuse_unsupported` looks at the composed config first and names the feature:
one line, the key, what the feature is and why it cannot run here.
"""

from __future__ import annotations

from typing import Any

from roll.configs.base import ConfigError

ENV_MANAGERS: dict[str, str] = {}
"""ROLL env manager classes roll does not have, and why."""

_SANDBOX = "needs a ROCK sandbox service, which roll has no client for"
ENV_TYPES = {
    "sokoban_sandbox": f"ROLL's Sokoban played inside a ROCK sandbox: {_SANDBOX} (the same game runs "
    "locally as env_type sokoban)",
    "rock_tb_native_env": f"ROLL's terminal-bench / SWE tasks run by an agent inside a ROCK sandbox: {_SANDBOX}",
    "sokoban_mcp": "ROLL's Sokoban behind an MCP server: needs that server (the same game runs locally as "
    "env_type sokoban)",
    "openreward_env": "ROLL's OpenReward env: needs the OpenReward API service",
    "atropos_env": "ROLL's Atropos env: needs a running Atropos server",
    "deepeyes": "ROLL's DeepEyes env: image question answering with a zoom-in tool over a hub dataset; not built "
    "here (roll's vision-language envs are the grid games with render_mode rgb_array)",
    "roll_math": "ROLL's GEM math env: GEM envs and their hub data sets are not supported",
    "roll_code": "ROLL's GEM code env: GEM envs and their hub data sets are not supported",
    "roll_qa": "ROLL's GEM QA env: GEM envs and their hub data sets are not supported",
}
"""ROLL env types (its gem registrations) that cannot run here, and why."""
RUNNERS = {
    "roll.pipeline.agentic.agent_runner.rock.push_runner.PushModeRunner": f"ROLL's ROCK push-mode runner {_SANDBOX}",
    "roll.pipeline.agentic.agent_runner.rock.pull_runner.PullModeRunner": f"ROLL's ROCK pull-mode runner {_SANDBOX}",
    "roll.pipeline.agentic.agent_runner.rock.rock_agent_runner.RockAgentRunner": f"ROLL's ROCK runner {_SANDBOX}",
}
"""ROLL agent runners (`agent_runner_cls`) that cannot run here, and why."""
GEM_PREFIXES = ("game:", "rg:", "logic:", "math:", "qa:", "code:", "eval:")
"""Prefixes of GEM env ids (`gem.make("game:GuessTheNumber-v0")`); envs/gem_envs runs them."""
GEM_DATASET_PREFIXES = ("logic:", "math:", "qa:", "code:", "eval:")
"""GEM id prefixes whose every env reads a hub dataset (gem registers them with `dataset_name`)."""

ENV_KEYS: dict[str, str] = {}
"""Keys of `custom_envs.<Tag>` that belong to a refused feature."""

WORKER_KEYS = {
    ("model_args", "freeze_module_prefix"): "ROLL's partial fine-tuning (freeze modules by name prefix, e.g. a "
    "VL model's vision tower) is not built in roll; train every "
    "parameter or use LoRA (lora_rank)",
}
"""Keys inside a role's sections that belong to a refused feature."""

STRATEGY_KEYS = {
    "apply_expert_patch": "ROLL's fsdp2 patch of MoE expert modules (each expert its own FSDP unit); roll's "
    "strategies have no MoE-specific sharding",
    "ep_size": "expert parallelism of MoE layers (ROLL's fsdp2); roll's strategies have no MoE-specific sharding",
}
"""`strategy_config` options of refused features: refused when on (true, or a size above 1)."""

TOP_KEYS = {
    "reward": "ROLL's reward-model worker (an LLM judge scoring episodes); roll's rewards come from the envs",
}
"""Top-level sections of refused features."""


def refuse_unsupported(data: dict[str, Any]) -> None:
    """`ConfigError` naming the first key of a refused ROLL feature in the composed `data`."""
    envs = data.get("custom_envs")
    for tag, env in envs.items() if isinstance(envs, dict) else ():  # the envs first: what a config is for
        if isinstance(env, dict):  # (a VL or a sandbox task) says most; every tag is built-checked
            _refuse_env(f"custom_envs.{tag}", env)
    for role in ("actor_train", "actor_infer", "critic", "reference"):
        worker = data.get(role)
        if not isinstance(worker, dict):
            continue
        for (section, key), why in WORKER_KEYS.items():
            if isinstance(worker.get(section), dict) and worker[section].get(key) is not None:
                raise ConfigError(f"{role}.{section}.{key}", why)
        strategy = worker.get("strategy_args")
        options = strategy.get("strategy_config") if isinstance(strategy, dict) else None
        for key, why in STRATEGY_KEYS.items():
            value = options.get(key) if isinstance(options, dict) else None
            if value is True or (type(value) is int and value > 1):  # on; False, 0 and 1 are off
                raise ConfigError(f"{role}.strategy_args.strategy_config.{key}", why)
    for key, why in TOP_KEYS.items():
        if data.get(key) is not None:
            raise ConfigError(key, why)


def _refuse_env(where: str, env: dict[str, Any]) -> None:
    manager = env.get("env_manager_cls")
    if manager in ENV_MANAGERS:
        raise ConfigError(f"{where}.env_manager_cls", ENV_MANAGERS[manager])
    runner = env.get("agent_runner_cls")
    if runner in RUNNERS:
        raise ConfigError(f"{where}.agent_runner_cls", RUNNERS[runner])
    env_type = env.get("env_type")
    if env_type in ENV_TYPES:
        raise ConfigError(f"{where}.env_type", f"{env_type!r} is {ENV_TYPES[env_type]}")
    gem = isinstance(env_type, str) and env_type.startswith(GEM_PREFIXES)
    if gem and isinstance(env_type, str) and env_type.startswith(GEM_DATASET_PREFIXES):
        raise ConfigError(
            f"{where}.env_type",
            f"{env_type!r} is a GEM env over a hub dataset, which is not available here (no downloads); "
            "GEM's game: and rg: envs generate their tasks locally",
        )
    if env.get("tool_wrapper") not in (None, "") and not gem:
        raise ConfigError(
            f"{where}.tool_wrapper",
            "ROLL's GEM tool wrapper wraps GEM env ids only (game:, rg:); roll's tool use is "
            'env_type "agent" (roll.agentic.agent_loop) or env_type code_sandbox',
        )
    for key, why in ENV_KEYS.items():
        if env.get(key) not in (None, ""):
            raise ConfigError(f"{where}.{key}", why)
