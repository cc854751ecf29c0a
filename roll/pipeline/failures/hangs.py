"""A call on a worker that never returns, named: the phase, the step, the seconds, who is stuck.

The driver waits at most `rpc_timeout` for any call on a training role or an engine (a scoring
pass, a training step, a weight sync, a checkpoint). When that wait runs out, Ray says only
`GetTimeoutError`. `named_hangs` turns it into `WorkerHung`, one line: the phase the pipeline was
in (`PhaseResidency.phase`), the step, the bound, and the processes of that phase that do not
answer a probe (`__ray_ready__`, which a training worker, a one-call-at-a-time actor, serves only
after the call it is in: alive but stuck, as against dead, which Ray reports as `RayActorError`).
The CLI prints it and exits 1; the run resumes from its last checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import ray

from roll.core.errors import RunStopped
from roll.pipeline.phases.gpu_offload import PHASE_ROLES, PhaseResidency

PROBE_S = 10.0
"""How long a probed process has to answer before it is named as not answering (at most half the
bound: a hang is named within 1.5x `rpc_timeout`)."""


class WorkerHung(RunStopped):
    """A call on a worker did not return within `rpc_timeout`; the message names where and who."""


def unanswering(handles: Mapping[Any, Any], probe_s: float = PROBE_S) -> list[Any]:
    """The keys of `handles` (actor handles) whose `__ray_ready__` is not answered within
    `probe_s` seconds (all probed at once), in the mapping's order."""
    probes = {handle.__ray_ready__.remote(): key for key, handle in handles.items()}
    ready, _ = ray.wait(list(probes), num_returns=len(probes), timeout=probe_s) if probes else ([], [])
    answered = {probes[ref] for ref in ready}
    return [key for key in handles if key not in answered]


def hang_line(phase: str, step: int, timeout_s: float, stuck: list[str], last_checkpoint: str | None) -> str:
    """The message of a `WorkerHung` (see the module docstring)."""
    who = ", ".join(stuck) if stuck else "every process of the phase answers a probe (the call itself is slow)"
    return (
        f"hang: step {step}, phase {phase}: a call on a worker did not return within {timeout_s:g} s "
        f"(rpc_timeout); not answering: {who}; last checkpoint: {last_checkpoint or 'none'}; resume with "
        "resume_from_checkpoint=true once it is fixed, or raise rpc_timeout if the call is only slow"
    )


@contextmanager
def named_hangs(
    residency: PhaseResidency, timeout_s: float, step: Callable[[], int], last_checkpoint: Callable[[], str | None]
) -> Iterator[None]:
    """Raise `WorkerHung` for a `GetTimeoutError` out of the block: the phase's processes are
    probed (every attached process when the phase names no role), `step()` and `last_checkpoint()`
    are asked then."""
    try:
        yield
    except ray.exceptions.GetTimeoutError:
        phase = residency.phase
        handles = residency.handles(PHASE_ROLES.get(phase)) or residency.handles()
        stuck = [f"{role} process {index}" for role, index in unanswering(handles, min(PROBE_S, timeout_s / 2))]
        raise WorkerHung(hang_line(phase, step(), timeout_s, stuck, last_checkpoint())) from None
