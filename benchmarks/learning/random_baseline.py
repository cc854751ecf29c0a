"""The random-valid-action baseline of an example's validation: its fixed validation maps (the
same env seeds the pipeline derives from `seed`), each played by a uniformly random valid action
(`TextEnv.sample_valid_action`) every turn, success averaged over `--plays` plays a map.

    python benchmarks/learning/random_baseline.py --config_path vl_frozen_lake \
        --config_name agentic_val_vl_frozen_lake [--seeds 1 2 3] [--plays 200] [--extra KEY=VALUE ...]

Prints one line per seed and the last line `RESULT random_valid=<mean over seeds>`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
import envs  # noqa: F401  registers the built-ins
from benchmarks.common import REPO
from roll.agentic.env.registry import make_env
from roll.configs.loader import load_config
from roll.core.seeding import derive_seed


def random_success(env, env_seed: int, max_actions: int, plays: int, rng: np.random.Generator) -> float:
    """Mean success of `plays` episodes of random valid actions from the map of `env_seed`."""
    wins = 0
    for _ in range(plays):
        env.reset(seed=env_seed)
        for _ in range(max_actions):
            _, _, terminated, truncated, info = env.step(env.sample_valid_action(rng))
            if terminated or truncated:
                break
        wins += bool(info["success"])
    return wins / plays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config_path", required=True, help="a dir under examples/ or any dir")
    parser.add_argument("--config_name", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--plays", type=int, default=200)
    parser.add_argument("--extra", nargs="*", default=[], help="hydra overrides, as a training run takes them")
    args = parser.parse_args()
    config_dir = Path(args.config_path)
    if not config_dir.is_dir():
        config_dir = REPO / "examples" / args.config_path
    means = []
    for seed in args.seeds:
        cfg = load_config(str(config_dir), args.config_name, [f"seed={seed}", *args.extra])
        manager = cfg.val_env_manager
        rng = np.random.default_rng(derive_seed(seed, "random_baseline"))
        values = []
        for j in range(manager.num_env_groups):
            env_cfg = cfg.custom_envs[manager.tags[j % len(manager.tags)]]
            env = make_env(env_cfg.env_type, env_cfg.env_config)
            env_seed = derive_seed(seed, "val", "env", j)  # as RolloutScheduler.group_spec in "val" mode
            values.append(random_success(env, env_seed, env_cfg.max_steps, args.plays, rng))
        means.append(statistics.fmean(values))
        print(f"seed {seed}: {len(values)} validation maps, random-valid success {means[-1]:.3f}")
    print(f"RESULT random_valid={statistics.fmean(means):.3f}")


if __name__ == "__main__":
    main()
