"""Python's cyclic garbage collector in long-running roll processes: freeze what startup made.

A full (generation 2) collection walks every object the collector tracks. A roll process holds
hundreds of thousands of them once torch, transformers and Ray are imported and its model or
envs are built, and they live as long as the process; walking them all stalls the process for a
visible part of a step, at moments no one chooses, in the driver, an env worker or the engine
alike (docs/gpu.md, "A step without the model").

`freeze_heap()` collects once, then moves every object alive into the permanent generation
(`gc.freeze`), which later collections skip; objects made afterwards are collected as before.
`freeze_actors(handles)` does the same inside each Ray actor (`__ray_call__`, so no worker class
needs to know). The pipeline calls both once its workers are built and again after its first
step, whose lazy imports and warm-up allocations are long-lived too. `ROLL_GC_FREEZE=0` in the
driver's environment turns it off (`enabled()`), to compare or to look for a leak.
"""

from __future__ import annotations

import gc

from roll.utils.env_switches import switched_on

ENV_SWITCH = "ROLL_GC_FREEZE"


def enabled() -> bool:
    """False when `ROLL_GC_FREEZE` is "0" (or "false", "no", "off"); True otherwise."""
    return switched_on(ENV_SWITCH)


def freeze_heap() -> int:
    """Collect garbage, then freeze every object now alive; returns how many are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _freeze_in_actor(_actor) -> int:  # runs inside the actor (`__ray_call__`)
    return freeze_heap()


def freeze_actors(handles: list) -> list:
    """Start `freeze_heap` in each actor of `handles`; returns the refs (each: the actor's frozen
    count) to `ray.get`."""
    return [h.__ray_call__.remote(_freeze_in_actor) for h in handles]
