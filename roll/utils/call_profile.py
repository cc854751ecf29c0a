"""Profile chosen calls of the pipeline's workers with `torch.profiler`: what a step waits on.

`ROLL_PROFILE_CALLS="train@20,compute_logprobs@20"` (method@call number, counted from 1 in each
worker process) in the driver's environment, and `ROLL_PROFILE_DIR` (default ./output/profiles):
`profiled(cls)` returns `cls` with those methods wrapped, and the builders put the workers in Ray
actors that way. The chosen call runs under `torch.profiler` (CPU, and CUDA where the process uses
it) and writes `<dir>/<Class>.<method>.<call>.<pid>.txt`: the call's wall seconds, then the ops
with the most self CPU time, then (CUDA) the most device time. Every other call costs a counter.
Without `ROLL_PROFILE_CALLS`, `profiled(cls)` is `cls`.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from pathlib import Path

ENV_CALLS = "ROLL_PROFILE_CALLS"
ENV_DIR = "ROLL_PROFILE_DIR"
TOP_OPS = 40


def parse_calls(text: str) -> dict[str, int]:
    """ "train@20,compute_logprobs@3" -> {"train": 20, "compute_logprobs": 3}; a bad entry raises."""
    calls: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        method, _, number = entry.partition("@")
        if not method.isidentifier() or not number.isdigit() or int(number) < 1:
            raise ValueError(f"{ENV_CALLS}: {entry!r} is not method@N (N >= 1)")
        calls[method] = int(number)
    return calls


def profiled(cls: type, environ: Mapping[str, str] | None = None) -> type:
    """`cls`, or a subclass of it whose methods named in ROLL_PROFILE_CALLS profile their Nth call."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    calls = {m: n for m, n in parse_calls(env.get(ENV_CALLS, "")).items() if callable(getattr(cls, m, None))}
    if not calls:
        return cls
    out_dir = Path(env.get(ENV_DIR) or "output/profiles").resolve()
    wrapped = {
        method: _profile_nth(getattr(cls, method), cls.__name__, number, out_dir) for method, number in calls.items()
    }
    return type(cls.__name__, (cls,), {"__module__": cls.__module__, "__doc__": cls.__doc__, **wrapped})


def _profile_nth(method, owner: str, number: int, out_dir: Path):
    count = 0

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        nonlocal count
        count += 1
        if count != number:
            return method(self, *args, **kwargs)
        return _run_profiled(
            method, self, args, kwargs, out_dir / f"{owner}.{method.__name__}.{number}.{os.getpid()}.txt"
        )

    return wrapper


def _run_profiled(method, self, args, kwargs, path: Path):
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        result = method(self, *args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    averages = prof.key_averages()
    parts = [
        f"wall_s {wall:.4f} (under the profiler)\n",
        averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPS),
    ]
    if cuda:
        parts.append(averages.table(sort_by="self_device_time_total", row_limit=TOP_OPS))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))
    return result
