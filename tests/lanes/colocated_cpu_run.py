"""The CLI with every worker process of the run planned on one stand-in device, on CPU: the
colocated layout of a GPU run (actor_train, actor_infer and reference sharing GPU 0, taking turns
through `roll.pipeline.phases.gpu_offload`) on a machine without a GPU. Each process is planned on device 0,
so the pipeline offloads and reloads roles exactly as on a GPU, but is started on CPU (no
`CUDA_VISIBLE_DEVICES`, torch device "cpu"). Used by tests/pipeline/test_colocated_cpu.py:
    python tests/lanes/colocated_cpu_run.py --config_path frozen_lake --config_name NAME [key=value ...]
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from roll.cli import main
from roll.distributed.placement import DevicePlan, ProcessPlacement
from roll.pipeline import run_setup
from roll.pipeline.setup import builders

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class StandInPlacement(ProcessPlacement):
    """Planned on device 0 (so roles count as colocated), started on CPU."""

    @property
    def torch_device(self) -> str:
        return "cpu"

    def ray_options(self) -> dict:
        return {}


def colocated_plan(cfg, place_workers=builders.place_workers) -> DevicePlan:
    """The run's CPU plan with every process moved onto stand-in device 0."""
    plan = place_workers(cfg)
    return DevicePlan(
        {role: tuple(StandInPlacement(p.role, p.index, 0, "0") for p in ps) for role, ps in plan.processes.items()}
    )


if __name__ == "__main__":
    run_setup.place_workers = builders.place_workers = colocated_plan
    sys.exit(main(sys.argv[1:], examples_dir=os.path.join(REPO, "examples")))
