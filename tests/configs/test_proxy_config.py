"""ROLL's agent-runner keys (`env_manager_cls: ...ProxyEnvManager`, `agent_runner_cls`) on a YAML
of our own in ROLL's dialect: accepted and mapped, or refused with the key named; and one real
training step of it with +profile=cpu_smoke."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll.configs import ConfigError, load_config
from roll.pipeline.checks.config import check_before_start
from roll.pipeline.setup.rollout_builders import env_spec, proxy_options

HERE = Path(__file__).parent / "roll_dialect" / "runs"
REPO = Path(__file__).parents[2]


def load(model_dir, *overrides):
    return load_config(str(HERE), "agent_runner", [f"pretrain={model_dir}", f"reward_pretrain={model_dir}", *overrides])


def test_rolls_runner_keys_are_accepted_and_reach_the_env_workers(model_dir):
    cfg = load(model_dir)
    check_before_start(cfg)
    lake, box = env_spec(cfg, "Lake", cfg.train_env_manager), env_spec(cfg, "Box", cfg.val_env_manager)
    assert lake.agent_runner_cls == "roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner"
    assert box.agent_runner_cls == "roll.pipeline.agentic.agent_runner.gem_runner.ToolCallRunner"
    assert cfg.train_env_manager.env_manager_type == "traj"  # proxy tags follow the manager's type
    assert proxy_options(cfg.train_env_manager.proxy) == {
        "model_names": ("roll-policy",),
        "max_body_bytes": 8 << 20,
        "episode_timeout_s": 120.0,
    }
    step = load(model_dir, "train_env_manager.env_manager_type=step")
    assert step.train_env_manager.env_manager_type == "step"


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["agent_runner_cls=null"], "custom_envs.Lake.agent_runner_cls", "ProxyEnvManager needs an agent runner"),
        (
            ["env_manager_cls=roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager"],
            "custom_envs.Lake.agent_runner_cls",
            "plays through the chat proxy",
        ),
        (
            ["agent_runner_cls=roll.pipeline.agentic.agent_runner.rock.push_runner.PushModeRunner"],
            "custom_envs.Lake.agent_runner_cls",
            "ROCK push-mode runner needs a ROCK sandbox",
        ),
        (["agent_runner_cls=not a path"], "custom_envs.Lake.agent_runner_cls", "is not a class path"),
        (["+custom_env.Lake.response_prefix=Answer"], "custom_envs.Lake.response_prefix", "leave it empty"),
        (["train_env_manager.proxy.episode_timeout_s=0"], "train_env_manager.proxy.episode_timeout_s", "greater"),
        (["+train_env_manager.proxy.port=80"], "train_env_manager.proxy.port", "unknown key"),
        (
            ["+train_env_manager.rescue_rounds=1", "+train_env_manager.rescue_temperature=1.5"],
            "train_env_manager.rescue_temperature",
            "tags ['Lake'] are played by agent loops or agent runners, which sample on their own",
        ),
    ],
)
def test_bad_runner_keys_are_refused_by_name(model_dir, overrides, key, says):
    with pytest.raises(ConfigError) as err:
        load(model_dir, *overrides)
    assert err.value.key == key and says in err.value.message, err.value


def test_a_runner_that_does_not_import_fails_before_start(model_dir):
    cfg = load(model_dir, "agent_runner_cls=my_pkg.agents.NoSuchRunner")
    with pytest.raises(ConfigError) as err:
        check_before_start(cfg)
    assert err.value.key == "custom_envs.Lake.agent_runner_cls" and "cannot be imported" in err.value.message


@pytest.mark.ray
def test_one_cpu_smoke_step_through_the_proxy(model_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config_path",
        str(HERE),
        "--config_name",
        "agent_runner",
        "+profile=cpu_smoke",
        f"pretrain={model_dir}",
        f"reward_pretrain={model_dir}",
        f"output_dir={out}",
        f"logging_dir={out}/logs",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["rollout/dropped_trajectories"] == 0.0
    assert last["train/env/proxy/requests"] >= 1.0 and "val/Box/env/proxy/generations" in last
    # the trainer's log-probs of the recorded tokens are the engine's: the ids and their places
    # in the sequence are exactly what the engine generated (a re-tokenised or shifted turn would
    # differ by whole nats)
    assert last["rollout/logprob_abs_diff"] < 1e-4
