"""AgenticRolloutPipeline: generate and score, never train (ROLL's rollout-only pipeline).

A config with `actor_infer` and no `actor_train` runs this (`roll.configs.rollout`). Per step, for
`max_steps` steps: `rollout_batch_size` trajectories on `train_env_manager`'s envs, played by
`actor_infer` on the `pretrain` weights through the same env workers and engine as training;
then their metrics, under `val/` as in ROLL (our episode statistics, and ROLL's
`val/score/{mean,max,min}` of the episode scores, per tag too), `system/samples`, and the step's
time, to metrics.jsonl, TensorBoard (`tracker_kwargs.log_dir`) and the `track_with` backend. What
ROLL writes besides, roll writes too: the trajectories to `rollout_dump_dir`, recordings for
`rollout_mock`; and, as in a training run, traces (`trace_rollouts`) and frames
(`render_save_dir`). Seeds derive from `seed` and the step, so a run is reproducible.

It differs from ROLL in the step numbers (1..max_steps, as our training steps, where ROLL counts
from 0) and in having no `max_steps: -1` (run until stopped).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from roll.configs.roll_compat.dialect import ENV_LIBRARY_VARIABLES
from roll.configs.rollout import unused_in_rollout
from roll.core.seeding import seed_everything
from roll.pipeline.phases.batch import summarize_trajectories
from roll.pipeline.phases.recorded_rollout import recorded, write_trajectories
from roll.pipeline.run_setup import freeze_heaps, make_tracer, make_tracker, rpc_timeout, run_tokenizer, start
from roll.pipeline.setup.builders import build_inference, inference_names
from roll.pipeline.setup.cluster import placement_rows, stop_on_loss_of, write_placement
from roll.pipeline.setup.rollout_builders import build_rollout
from roll.tracking.progress import ProgressBar

logger = logging.getLogger("roll")


class AgenticRolloutPipeline:
    def __init__(self, cfg):
        self.cfg = cfg
        seed_everything(cfg.seed)
        unused = unused_in_rollout(set(cfg.model_fields_set), set(ENV_LIBRARY_VARIABLES))
        if unused:  # ROLL's rollout pipeline ignores them too; say so rather than pass over them
            logger.warning("rollout-only run (no actor_train): these keys are not used: %s", ", ".join(unused))
        self.residency = start(cfg)
        self.tokenizer = run_tokenizer(cfg)
        self.inference = build_inference(cfg, self.residency)
        self.rollout = recorded(
            build_rollout(cfg, cfg.train_env_manager, inference_names(cfg), self.tokenizer, mode="train"),
            cfg.rollout_mock,
        )
        placed = placement_rows(self.residency.plan, {"inference": self.inference}, {"train": self.rollout.workers})
        write_placement(cfg.output_dir, placed)
        stop_on_loss_of(placed)
        self.tracker = make_tracker(cfg, resume_step=-1)
        self.tracker.log_config(cfg)
        self.tracer = make_tracer(cfg, self.tokenizer, self.tracker)
        freeze_heaps({"inference": self.inference}, [self.rollout], rpc_timeout(cfg))  # roll.utils.heap

    def run(self) -> dict[str, float]:
        cfg, metrics = self.cfg, {}
        progress = ProgressBar(cfg.max_steps)
        samples = 0
        for step in range(1, cfg.max_steps + 1):
            start_s = time.perf_counter()
            trajs, dropped = self.rollout.collect(
                step, cfg.train_groups_per_step, keep_frames=self._frames, policy_version=0
            )
            for cause in dropped:
                logger.warning("step %d: dropped a trajectory: %s", step, cause)
            samples += len(trajs)
            elapsed = time.perf_counter() - start_s
            metrics = {
                **summarize_trajectories(trajs, "val"),
                **episode_scores(trajs, "val"),
                "val/dropped_trajectories": float(len(dropped)),
                "system/samples": float(samples),
                "time/rollout_s": elapsed,
                "time/step_s": elapsed,
            }
            write_trajectories(cfg, step, trajs, self.tokenizer, self.tracer, frames=self._frames)
            if step % cfg.logging_steps == 0 or step == cfg.max_steps:
                self.tracker.log(step, metrics)
            progress.update(step, metrics)
        progress.close()
        self.tracker.close()
        return metrics

    @property
    def _frames(self) -> bool:
        return self.cfg.render_save_dir is not None


def episode_scores(trajs: list, prefix: str) -> dict[str, float]:
    """ROLL's `score/mean`, `score/max`, `score/min` of the episode scores (the sum of an episode's
    rewards), over all trajectories and per tag (`prefix/<tag>/score/...`)."""
    if not trajs:
        return {}
    groups = {"": trajs}
    for tr in trajs:
        groups.setdefault(f"{tr.tag}/", []).append(tr)
    out = {}
    for tag, group in groups.items():
        scores = np.array([tr.episode_reward for tr in group], dtype=float)
        out.update(
            {
                f"{prefix}/{tag}score/mean": float(scores.mean()),
                f"{prefix}/{tag}score/max": float(scores.max()),
                f"{prefix}/{tag}score/min": float(scores.min()),
            }
        )
    return out
