"""AgenticPipeline: the training loop, read top to bottom in `run()`.

Per step: (1) rollout complete env groups on the current policy, (2) turn trajectories into one
padded batch, (3) score it (old / reference log-probs, values, advantages), (4) update critic then
actor, (5) push the new weights to the inference worker, (6) log, validate and checkpoint on their
own counters. Synchronous by default: rollout of step t+1 starts after the weights of step t are
in place. With `async_generation_ratio` k > 0 the groups of steps t+1..t+k start right after step
t's rollout, on the weights of that moment, and generate while step t trains (`run_ahead`).
Roles that share GPUs take turns on them: each phase first makes its roles resident
(`self.residency.enter`, roll/pipeline/phases/gpu_offload.py), which does nothing when no GPU is shared.
Each step logs its phase times (`time/*_s`; the residency's offload and reload waits are parts of
them), each role's compute, sync and idle seconds (`time/idle/<role>`, roll/pipeline/phases/idle_time.py) and,
with roles on GPUs, each role's peak GPU memory (`memory/<role>_peak_gib`).
"""

from __future__ import annotations

import logging
import shutil
import time
from contextlib import contextmanager

import ray

from roll.algorithms.kl import make_kl_controller
from roll.configs.roll_compat.dialect import old_logprobs_in_train, old_logprobs_pass_needed
from roll.core.enums import SampleMode
from roll.core.fields import Batch, RowInfo
from roll.core.seeding import seed_everything
from roll.distributed.weight_transfer import CUDA_IPC
from roll.distributed.workers.old_logprobs import logprob_abs_diff
from roll.distributed.workers.partial import COUNTS as INTERRUPT_COUNTS
from roll.pipeline.checks.run_dirs import checkpoint_bytes
from roll.pipeline.failures.disk_full import DiskFull, disk_full_line, is_disk_full
from roll.pipeline.failures.divergence import engine_gap_warning, stop_if_diverged
from roll.pipeline.failures.hangs import named_hangs
from roll.pipeline.phases import checkpoint as ckpt
from roll.pipeline.phases.batch import (
    adjust_batch,
    batch_divisor,
    build_step_batch,
    build_traj_batch,
    filter_groups,
    staleness_metrics,
    summarize_trajectories,
)
from roll.pipeline.phases.idle_time import StepClock
from roll.pipeline.phases.recorded_rollout import log_validation_images, recorded, write_trajectories
from roll.pipeline.phases.scoring import (
    clip_rewards,
    final_values,
    normalize_step_episode_scores,
    normalize_traj_rewards,
    reward_kl_coef,
    score_batch,
    score_step_batch,
    with_final_state,
)
from roll.pipeline.run_setup import freeze_heaps, make_tracer, make_tracker, rpc_timeout, run_tokenizer, start
from roll.pipeline.setup.builders import build_advantage_options, build_loss_options, build_workers, inference_names
from roll.pipeline.setup.cluster import placement_rows, stop_on_loss_of, write_placement
from roll.pipeline.setup.cpu_shares import call_all, score_in_turns
from roll.pipeline.setup.rollout_builders import build_rollout
from roll.pipeline.setup.sync_path import sync_path
from roll.tracking.progress import ProgressBar

logger = logging.getLogger("roll")


class AgenticPipeline:
    def __init__(self, cfg):
        self.cfg = cfg
        seed_everything(cfg.seed)
        # envs, datasets, device layout checked (ConfigError); which roles hold their GPUs in each
        # phase (a layout this machine cannot hold stops before Ray starts); Ray
        self.residency = start(cfg)
        self.tokenizer = run_tokenizer(cfg)
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        )
        self.workers = build_workers(cfg, self.residency)
        infer = inference_names(cfg)  # env workers find the inference workers by name (they may restart)
        self.train_rollout = recorded(
            build_rollout(cfg, cfg.train_env_manager, infer, self.tokenizer, mode="train"), cfg.rollout_mock
        )
        self.val_rollout = None
        if cfg.eval_steps > 0:
            self.val_rollout = recorded(
                build_rollout(cfg, cfg.val_env_manager, infer, self.tokenizer, mode="val"), cfg.rollout_mock
            )
        rollouts = {"train": self.train_rollout, "val": self.val_rollout}
        placed = placement_rows(
            self.residency.plan, self.workers, {name: r.workers for name, r in rollouts.items() if r is not None}
        )
        write_placement(cfg.output_dir, placed)  # where everything landed
        stop_on_loss_of(placed)  # on a cluster: losing a node of env workers only does not stop the run
        self.loss_options = build_loss_options(cfg)  # the actor's loss, passed whole to each train call
        self.temperature = self.loss_options.temperature
        self.advantage_options = build_advantage_options(cfg)  # the score phase's, likewise
        self.step_wise = cfg.sample_mode == SampleMode.STEP
        self.build_batch = build_step_batch if self.step_wise else build_traj_batch
        training_roles = ["actor_train"] + [r for r in ("critic", "reference") if r in self.workers]
        self.batch_divisor = batch_divisor(cfg, training_roles)
        self.score_in_turns = score_in_turns(cfg, training_roles)
        self.old_logprobs_in_train = old_logprobs_in_train(cfg)  # else a pass of the actor's own when scoring
        if not self.old_logprobs_in_train:
            why = old_logprobs_pass_needed(cfg) or "enable_old_logprobs_recompute: true"
            logger.info("score phase: the actor's old log-probs in a pass of their own (%s)", why)
        if self.score_in_turns:
            logger.info("score phase: %s pass in turns (their threads outnumber the cores)", ", ".join(training_roles))
        self.kl_ctl = make_kl_controller(cfg.init_kl_coef, cfg.target_kl, cfg.kl_horizon)
        self.sync_path = sync_path(cfg, self.residency.plan)  # CUDA IPC when actor and engine share a GPU
        self.clock = StepClock(self.workers, self.timeout_s)
        self.start_step = self._resume()
        self.step = self.start_step  # the step being trained (its validation and checkpoint included)
        # a fresh run starts its metrics over; a resumed one drops what was logged past its checkpoint
        self.tracker = make_tracker(cfg, resume_step=self.start_step if self.start_step else -1)
        self.tracker.log_config(cfg)
        self.tracer = make_tracer(cfg, self.tokenizer, self.tracker)
        self.freeze_heaps()  # what startup made is long-lived: full GC collections skip it from now on

    def run(self) -> dict[str, float]:
        """Train up to `max_steps`; a call on a worker that outlasts `rpc_timeout` ends the run
        with one line naming the phase, the step and the processes that do not answer."""
        with named_hangs(self.residency, self.timeout_s, lambda: self.step, self._last_checkpoint):
            return self._train()

    def _last_checkpoint(self) -> str | None:
        latest = ckpt.latest(self.cfg.checkpoint_dir)
        return None if latest is None else str(latest)

    def _train(self) -> dict[str, float]:
        cfg = self.cfg
        metrics: dict[str, float] = {}
        if self.start_step >= cfg.max_steps:  # e.g. a finished run resumed without raising max_steps
            logger.warning(
                "nothing to train: resumed at step %d and max_steps is %d; raise max_steps to go on",
                self.start_step,
                cfg.max_steps,
            )
            self.tracker.close()
            return metrics
        progress = ProgressBar(cfg.max_steps, initial=self.start_step)
        self.residency.take_seconds()  # the first step's offload time starts now, not with the workers' startup
        # model/trainable_params, model/total_params: once per run, with the first logged step
        model_size = ray.get(self.workers["actor"].param_counts.remote(), timeout=self.timeout_s)
        if self.val_rollout is not None and self.start_step == 0:
            self.tracker.log(0, self.validate(0))  # where the untrained policy starts
        for step in range(self.start_step + 1, cfg.max_steps + 1):
            self.step = step
            metrics = self.train_step(step)
            # 6. Log / validate / checkpoint
            if self.val_rollout is not None and (step % cfg.eval_steps == 0 or step == cfg.max_steps):
                metrics.update(self.validate(step))
            if step % cfg.logging_steps == 0 or step == cfg.max_steps:
                self.tracker.log(step, {**model_size, **metrics})
                model_size = {}
            self.after_step(step, metrics)
            progress.update(step, metrics)
        progress.close()
        self.tracker.close()
        return metrics

    def train_step(self, step: int) -> dict[str, float]:
        """Phases 1-5 of one step, and its metrics; the trajectories are written out."""
        cfg = self.cfg
        timings: dict[str, float] = {}
        self.clock.start()  # each role's compute, sync and idle seconds in the step (roll/pipeline/phases/idle_time.py)
        # 1. Rollout: complete groups of trajectories on the current weights (version step - 1),
        #    or at most async_generation_ratio versions older; then the next steps' groups start
        with _timer(timings, "rollout"):
            trajs, dropped = self.rollout(step)
        # 2. Batch: the most informative groups (StarPO-S), one row per trajectory or env step
        with _timer(timings, "batch"):
            kept, filter_metrics = filter_groups(trajs, cfg.rollout_filter_ratio)
            batch, rows = self.build_batch(kept, self.pad_id)
        # 3. Score: old/ref log-probs, values, then advantages
        with _timer(timings, "score"):
            score_metrics = self.score(batch, rows, step)
        # ROLL's batch_adjust_mode: rows copied or deleted to whole mini-batches (after scoring)
        batch, adjust_metrics = adjust_batch(batch, cfg.batch_adjust_mode, self.batch_divisor, cfg.seed, step)
        # 4. Update: critic, then actor
        with _timer(timings, "train"):
            train_metrics = self.update(batch, step)
        # 5. Sync: new actor weights to the inference engine
        with _timer(timings, "sync"):
            self.sync_weights(version=step)
        step_time = self.clock.finish()
        metrics = {
            **self.rollout_metrics(trajs, dropped, step),
            **filter_metrics,
            **score_metrics,
            **adjust_metrics,
            **train_metrics,
            **{f"time/{k}_s": v for k, v in timings.items()},
            **step_time,
            **self.residency.take_seconds(),
            "sync/cuda_ipc": float(self.sync_path == CUDA_IPC),
            **self.memory_metrics(first_step=step == self.start_step + 1),
        }
        # what the policy did: every trajectory decoded (trace_rollouts), ROLL's rollout_dump_dir
        write_trajectories(cfg, step, trajs, self.tokenizer, self.tracer)
        return metrics

    def after_step(self, step: int, metrics: dict[str, float]) -> None:
        """Stop on divergence; after the first step, freeze the heaps and warn of an engine gap;
        checkpoint on `save_steps`."""
        cfg = self.cfg
        stop_if_diverged(metrics, cfg.max_consecutive_skipped_steps, step)
        if step == self.start_step + 1:  # the first step's lazy imports and warm-up are long-lived too
            self.freeze_heaps()
            if gap := engine_gap_warning(metrics, step):
                logger.warning(gap)
        if cfg.save_steps > 0 and (step % cfg.save_steps == 0 or step == cfg.max_steps):
            self.save(step)

    def freeze_heaps(self) -> None:
        """`freeze_heaps` in the driver, every worker and every env worker (roll.utils.heap)."""
        freeze_heaps(self.workers, [self.train_rollout, self.val_rollout], self.timeout_s)

    @property
    def timeout_s(self) -> float:
        """How long one call on a worker may take (`rpc_timeout`)."""
        return rpc_timeout(self.cfg)

    def rollout_metrics(self, trajs: list, dropped: list[str], step: int) -> dict[str, float]:
        """Episode statistics of the step's trajectories, what the rollout lost (each dropped
        trajectory's cause is logged too), and the group ledger (`RolloutScheduler.take_counts`:
        `rollout/dispatched_groups` = collected + failed + the change in outstanding)."""
        for cause in dropped:
            logger.warning("step %d: dropped a trajectory: %s", step, cause)
        return {
            **summarize_trajectories(trajs, "train"),
            **staleness_metrics(trajs, step - 1),
            "rollout/dropped_trajectories": float(len(dropped)),
            "rollout/generated_tokens": float(sum(tr.num_generated_tokens for tr in trajs)),
            "rollout/stale_dropped_groups": float(self.train_rollout.stale_dropped_groups),
            "rollout/redundant_trajectories": float(self.train_rollout.redundant_trajectories),
            "rollout/engine_calls": float(self.train_rollout.engine_calls),
            "rollout/engine_requests": float(self.train_rollout.engine_requests),
            **self.interruptions(),
            **{f"rollout/{key}": float(n) for key, n in self.train_rollout.take_counts().items()},
        }

    def interruptions(self) -> dict[str, float]:
        """What the weight syncs since the last call did to generations in flight (`partial_rollout`):
        `rollout/interrupted_requests`, `rollout/discarded_tokens`, `rollout/recomputed_tokens`,
        summed over the engines (one that is restarting counts nothing)."""
        refs = [w.take_interruptions.remote() for w in self.workers["inference"]]
        totals = {f"rollout/{key}": 0.0 for key in INTERRUPT_COUNTS}
        for ref in refs:
            try:
                counts = ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.RayActorError:
                continue
            for key, value in counts.items():
                totals[f"rollout/{key}"] = totals.get(f"rollout/{key}", 0.0) + value
        return totals

    def memory_metrics(self, first_step: bool) -> dict[str, float]:
        """`memory/<role>_peak_gib`: the most GPU memory a process of each role held since the last
        step (`take_memory_gib`); nothing when every role runs on CPU. After the run's first step,
        roles that share a GPU and fit on it together stop taking turns (`stay_if_room`)."""
        readings = self.residency.read_memory()
        if first_step and readings:
            kept = self.residency.stay_if_room(readings)
            if kept:
                logger.warning("GPU %s: the roles there fit together; they stay resident from now on", kept)
        peaks: dict[str, float] = {}
        for (role, _), reading in readings.items():
            peaks[role] = max(peaks.get(role, 0.0), reading["peak"])
        return {f"memory/{role}_peak_gib": peak for role, peak in peaks.items()}

    def rollout(self, step: int) -> tuple[list, list[str]]:
        """The step's complete groups and the causes of dropped trajectories; then the groups of
        the next steps start (`run_ahead`). With partial rollout they have started already, and
        the step takes the first groups to finish among its own and theirs."""
        self.residency.enter("rollout")
        cfg = self.cfg
        first_done = cfg.partial_rollout != "finish"  # take the groups that finish first
        if first_done:  # among this step's and the next steps': no wait on the slowest group
            self.train_rollout.dispatch(step, cfg.train_groups_per_step)  # its own groups first
            self.run_ahead(step)
        trajs, dropped = self.train_rollout.collect(
            step,
            cfg.train_groups_per_step,
            policy_version=step - 1,
            max_staleness=cfg.staleness_limit,
            first_done=first_done,
        )
        self.run_ahead(step)
        return trajs, dropped

    def run_ahead(self, step: int) -> None:
        """Async training: start the groups of steps step+1..step+k (k = async_generation_ratio,
        at most the staleness limit, never past max_steps) now, so they generate on these weights
        while this step trains."""
        last = min(step + self.cfg.steps_ahead, self.cfg.max_steps)
        for ahead in range(step + 1, last + 1):
            self.train_rollout.dispatch(ahead, self.cfg.train_groups_per_step)

    def score(self, batch, rows: RowInfo, step: int = 1) -> dict[str, float]:
        """Reference log-probs, values and old log-probs, then rewards into advantages. The actor
        takes the old log-probs when training (`old_logprobs_in_train`) except in `critic_warmup`
        steps, where it does not train: there this pass gives the engine-gap metric."""
        in_train = self.old_logprobs_in_train and step > self.cfg.critic_warmup
        self.residency.enter("score_without_actor" if in_train else "score")
        workers, temperature, passes = self.workers, self.temperature, {}
        if not in_train:
            passes[Batch.OLD_LOGPROBS] = lambda: workers["actor"].compute_logprobs.remote(batch, temperature)
        if "reference" in workers:
            passes[Batch.REF_LOGPROBS] = lambda: workers["reference"].compute_logprobs.remote(batch, temperature)
        if "critic" in workers:  # one position more: the value of each row's last state
            critic_input = with_final_state(batch)
            passes[Batch.VALUES] = lambda: workers["critic"].compute_values.remote(critic_input)
        results = call_all(passes, self.score_in_turns, self.timeout_s)  # in turns where they share CPU cores
        if Batch.VALUES in results:  # GAE bootstraps truncated rows from the value of their last state
            rows.final_values = final_values(results[Batch.VALUES], critic_input[Batch.ATTENTION_MASK])
            results[Batch.VALUES] = results[Batch.VALUES][:, :-1]
        for key, value in results.items():
            batch[key] = value
        cfg = self.cfg
        reward_metrics = self.shape_rewards(batch, rows)
        if self.step_wise:
            metrics = score_step_batch(batch, rows, self.advantage_options)
        else:
            kl_coef = reward_kl_coef(self.kl_ctl.value, cfg.uses_kl_penalty, cfg.add_token_level_kl)
            metrics = score_batch(batch, rows, self.advantage_options, kl_coef=kl_coef)
        metrics.update(reward_metrics)
        if "critic/kl" in metrics:
            self.kl_ctl.update(metrics["critic/kl"], n_steps=batch.batch_size[0])
        if Batch.OLD_LOGPROBS in batch.keys():  # else the actor's training call reports it
            metrics.update(logprob_abs_diff(batch))
        return metrics

    def shape_rewards(self, batch, rows: RowInfo) -> dict[str, float]:
        """Before the estimator: keep the raw episode scores for TOPR, then `reward_normalization`
        and `reward_clip`, in place."""
        cfg = self.cfg
        if cfg.actor_train.pg_variant == "topr":  # TOPR splits rows by the raw episode score's sign
            raw = rows.episode_scores if self.step_wise else rows.scores
            assert raw is not None  # the batch phase fills the scores of its sample mode
            batch["episode_scores"] = raw.float().clone()
        if cfg.reward_normalization is not None and self.step_wise:
            if cfg.adv_estimator != "step_reinforce":  # which normalises its step returns when scoring
                normalize_step_episode_scores(rows, cfg.reward_normalization)
        elif cfg.reward_normalization is not None:
            normalize_traj_rewards(batch, rows, cfg.reward_normalization)
        if cfg.reward_clip is None:
            return {}
        return clip_rewards(batch, rows, cfg.reward_clip, self.step_wise)

    def update(self, batch, step: int) -> dict[str, float]:
        cfg, metrics = self.cfg, {}
        self.residency.enter("train")
        if "critic" in self.workers:
            metrics.update(
                ray.get(
                    self.workers["critic"].train.remote(
                        batch,
                        ppo_epochs=cfg.ppo_epochs,
                        value_clip=cfg.value_clip,
                        loss_agg_mode=cfg.loss_agg_mode,
                        step=step,
                    ),
                    timeout=self.timeout_s,
                )
            )
        if step <= cfg.critic_warmup:  # ROLL's critic_warmup: the first steps train the critic only
            return metrics
        loss = self.loss_options.at_step(step)  # the entropy weight of this step (its schedule)
        metrics.update(
            ray.get(
                self.workers["actor"].train.remote(batch, loss, ppo_epochs=cfg.ppo_epochs, step=step),
                timeout=self.timeout_s,
            )
        )
        metrics["actor/entropy_loss_coef"] = loss.entropy_coef
        return metrics

    def sync_weights(self, version: int) -> None:
        """The actor's weights into every engine. On a shared GPU (`CUDA_IPC`) both stay resident
        while the engine copies from the actor's own tensors through IPC handles (such an engine
        shares its GPU, so Ray does not restart it). Otherwise the CPU copies are requested first
        (Ray runs an actor's calls in order, so before an offload empties the module), then the
        phase may move the actor off a shared GPU and wake the engine: weights must reach an awake
        engine; the run's WeightStore keeps them for an engine that Ray restarts. Either way the
        handles or copies are passed by reference: nothing goes through the driver."""
        if self.sync_path == CUDA_IPC:
            self.residency.enter("sync_on_device")
            weights = self.workers["actor"].share_weights.remote()
            ray.get(
                [w.update_weights.remote(weights, version) for w in self.workers["inference"]], timeout=self.timeout_s
            )
            return
        weights = self.workers["actor"].get_weights.remote()  # passed by reference: no driver copy
        self.residency.enter("sync")
        # first: an engine that Ray restarts from now on loads these (roll.distributed.workers.weight_store)
        if "weight_store" in self.workers:
            ray.get(self.workers["weight_store"].put.remote([weights], version), timeout=self.timeout_s)
        updates = {w.update_weights.remote(weights, version): w for w in self.workers["inference"]}
        for ref, engine in updates.items():
            try:
                ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.RayActorError as err:  # died: restarted, it loads the stored weights itself
                if err.actor_init_failed:
                    raise
                _wait_until_back(engine, self.timeout_s)

    def validate(self, step: int) -> dict[str, float]:
        cfg, start = self.cfg, time.perf_counter()
        self.residency.enter("validate")
        keep_frames = cfg.render_save_dir is not None
        trajs, dropped = self.val_rollout.collect(step, cfg.val_groups_per_eval, keep_frames=keep_frames)
        for cause in dropped:
            logger.warning("validation at step %d: dropped a trajectory: %s", step, cause)
        write_trajectories(cfg, step, trajs, self.tokenizer, self.tracer, val=True, frames=keep_frames)
        if keep_frames:
            log_validation_images(cfg, self.tracker, step, trajs)
        return {
            **summarize_trajectories(trajs, "val"),
            "val/dropped_trajectories": float(len(dropped)),
            "val/engine_calls": float(self.val_rollout.engine_calls),
            "time/validate_s": time.perf_counter() - start,
        }

    def save(self, step: int) -> None:
        """Checkpoint `step`; a full disk deletes the half-written one and raises `DiskFull`."""
        self.residency.enter("checkpoint")
        root = ckpt.checkpoint_root(self.cfg.checkpoint_dir)
        tmp = None
        try:
            tmp = ckpt.begin(self.cfg.checkpoint_dir, step)
            refs = [self.workers["actor"].save_checkpoint.remote(str(tmp))]
            if "critic" in self.workers:
                refs.append(self.workers["critic"].save_checkpoint.remote(str(tmp / "critic")))
            ray.get(refs, timeout=self.timeout_s)
            # the groups dispatched and not yet trained: a resumed run plays them again (`_resume`)
            state = {"kl_ctl": self.kl_ctl.state_dict(), "rollout": self.train_rollout.ledger()}
            ckpt.commit(self.cfg.checkpoint_dir, tmp, step, state)
        except Exception as err:
            need = checkpoint_bytes(self.cfg)
            # torch.save says only "file write failed": a disk left with less than one checkpoint counts too
            if not (is_disk_full(err) or shutil.disk_usage(root).free < need):
                raise
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)  # it would only hold the space a resume needs
            line = disk_full_line(root, need, ckpt.latest(self.cfg.checkpoint_dir))
            raise DiskFull(f"step {step}: {line}") from None
        for path in ckpt.prune(self.cfg.checkpoint_dir, self.cfg.max_ckpt_to_keep):
            logger.info("max_ckpt_to_keep=%d: deleted %s", self.cfg.max_ckpt_to_keep, path)

    def _resume(self) -> int:
        cfg = self.cfg
        path = ckpt.resolve_resume(cfg.resume_from_checkpoint, cfg.checkpoint_dir)
        if path is None:
            if cfg.resume_from_checkpoint is True:
                logger.warning(
                    "resume_from_checkpoint: no checkpoint under %s yet; starting fresh",
                    ckpt.checkpoint_root(cfg.checkpoint_dir),
                )
            return 0
        state = ckpt.read_state(path)
        self.residency.enter("checkpoint")
        refs = [self.workers["actor"].load_checkpoint.remote(str(path))]
        if "critic" in self.workers:
            refs.append(self.workers["critic"].load_checkpoint.remote(str(path / "critic")))
        ray.get(refs, timeout=self.timeout_s)
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.sync_weights(version=state["step"])
        # async: the groups owed at the checkpoint (run ahead, carried over) start again under
        # their identities, on these weights; what they had generated by the kill is lost
        self.train_rollout.restore(state.get("rollout", []))
        logger.warning("resumed from %s (step %d)", path, state["step"])
        return int(state["step"])


def _wait_until_back(handle, timeout_s: float) -> None:
    """Block until the actor Ray is restarting answers (a call made while it restarts fails at once
    with `ActorUnavailableError`); its death for good, or `timeout_s`, raises."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=max(deadline - time.monotonic(), 1.0))
            return
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextmanager
def _timer(timings: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start
