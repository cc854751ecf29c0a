"""Where a config's workers would land, without building them:

    python -m roll.pipeline.placement_check --config_path DIR --config_name NAME [overrides ...]

Joins the cluster (`ray_address` / `RAY_ADDRESS`) or starts a local Ray exactly as a run does,
plans `device_mapping` (`roll.pipeline.setup.builders.place_workers`: over the cluster's nodes with
`num_gpus_per_node`), and starts every process of every role through the builders' own code
(`_start_role` for the training roles, `node_spots` for `actor_infer`): the same placement groups,
node bundles, `CUDA_VISIBLE_DEVICES` and torch.distributed variables. Only the class differs: a
probe that loads no model and never touches CUDA, and reports what its process sees: its node, its
`CUDA_VISIBLE_DEVICES`, the `MASTER_ADDR` of its rank group. They go to `output_dir/placement.json`
(a run's form, plus `master_addr`), and exit 0; a layout the cluster cannot hold exits 2 with one
line naming the key, as a run does.

What it shows: which node and which of the node's GPUs each process is given, and that rank groups
rendezvous on their rank 0's node. What it does not: that those GPUs exist physically and work (Ray
counts the GPUs a node declares; `ray start --num-gpus=2` declares two on a machine with none, which
is how .ci/run_cluster checks a GPU layout on CPU namespaces), nor that NCCL connects the ranks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import ray


class PlacementProbe:
    """Stands in for a worker process: takes any constructor arguments and reports where it is."""

    def __init__(self, *args, **kwargs):
        pass

    def where(self) -> dict[str, str | None]:
        return {
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES") or "cpu",
            "master_addr": os.environ.get("MASTER_ADDR"),
        }


def probe_rows(plan) -> list[dict]:
    """One row per planned process (`plan`, a `DevicePlan`), from a probe started where the real
    worker would be."""
    from roll.pipeline.setup.builders import _remote, _start_role, node_spots

    rows = []
    for role, placements in plan.processes.items():
        if role == "actor_infer":  # replicas, not ranks: as build_workers starts them
            handles = [
                _remote(PlacementProbe, p, **spot).remote()
                for p, spot in zip(placements, node_spots(role, placements), strict=True)
            ]
        else:
            started = _start_role(PlacementProbe, plan, role)
            handles = getattr(started, "handles", [started])
        seen = ray.get([h.where.remote() for h in handles], timeout=300)
        rows += [{"role": role, "rank": p.index, **where} for p, where in zip(placements, seen, strict=True)]
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from roll.configs.command_line import parse_config_args, resolve_config_dir

    args = parse_config_args(argv, "placement_check", __doc__.split("\n\n")[0])
    from roll.configs import ConfigError, load_config
    from roll.distributed.placement import PlacementError
    from roll.pipeline.checks.config import check_before_start
    from roll.pipeline.setup.builders import init_ray, place_workers
    from roll.pipeline.setup.cluster import ClusterError, write_placement

    try:
        cfg = load_config(resolve_config_dir(args.config_path, "examples"), args.config_name, args.overrides)
        check_before_start(cfg)
        init_ray(cfg.ray_address, cfg.system_envs)
        write_placement(cfg.output_dir, probe_rows(place_workers(cfg)))
    except (ConfigError, PlacementError) as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except ClusterError as err:
        print(f"cluster error: {err}", file=sys.stderr)
        return 2
    finally:
        if ray.is_initialized():
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
