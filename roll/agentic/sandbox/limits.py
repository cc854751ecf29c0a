"""The limits a sandboxed command runs under, and what one run of a command gave back.

`SandboxLimits` is plain data (an env takes it as `env_config.sandbox`); `CommandResult.reason`
names the first limit a command hit, or "ok" / "exit_code" when it finished by itself. The
reasons in `VIOLATIONS` are escape attempts or runaways: the sandbox counts them per episode and
an env ends the episode on one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

VIOLATIONS = (
    "wall_time",  # still running at the wall-clock limit (sleeping forever, a busy loop)
    "cpu_time",  # killed by RLIMIT_CPU
    "memory",  # an allocation failed under RLIMIT_AS
    "processes",  # a fork failed under RLIMIT_NPROC (a fork bomb)
    "output",  # wrote more than output_bytes (endless output)
    "file_size",  # a file grew past RLIMIT_FSIZE
    "disk",  # the workspace grew past disk_mb (many files, each under RLIMIT_FSIZE)
    "network",  # tried the network and found none
    "write_outside",  # tried to write outside the workspace and was refused
    "signal_denied",  # tried to signal a process it may not (its parent, ours)
    "parent_killed",  # killed the launcher that supervises it
)
"""Reasons that count as violations, in the order `CommandResult.reason` prefers them."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits. Defaults suit the shipped coding tasks (a test run is < 1 s of CPU)."""

    wall_s: float = 10.0
    """Wall-clock seconds before the command and everything it started is killed."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU) of each process."""
    memory_mb: int = 512
    """Address space of each process in MiB (RLIMIT_AS)."""
    max_procs: int = 32
    """Processes the command may have at once (RLIMIT_NPROC; see docs/sandbox.md)."""
    output_bytes: int = 16384
    """Bytes of stdout+stderr kept; a command writing more is killed."""
    file_size_mb: int = 16
    """Largest file the command may write, in MiB (RLIMIT_FSIZE)."""
    disk_mb: int = 256
    """MiB the workspace may hold (each entry's blocks, at least 4 KiB: empty files count too);
    measured every 0.05 s (`sandbox.DISK_POLL_S`; less often for a workspace slow to measure)
    while a command runs and when it ends: past it, the command is killed (reason "disk")."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"sandbox limit {name} must be a positive number, got {value!r}")

    @classmethod
    def of(cls, config: SandboxLimits | dict[str, Any] | None) -> SandboxLimits:
        """Limits from an env_config block (unknown keys are a TypeError naming them)."""
        if isinstance(config, SandboxLimits):
            return config
        config = dict(config or {})
        unknown = sorted(set(config) - set(cls.__dataclass_fields__))
        if unknown:
            raise TypeError(f"unknown sandbox key(s) {unknown}; accepted: {sorted(cls.__dataclass_fields__)}")
        return cls(**config)


@dataclass(frozen=True)
class CommandResult:
    """One command's run: its (capped) output, how it ended, and why."""

    output: str
    exit_code: int | None
    reason: str
    """"ok" (exit 0), "exit_code" (another exit code) or one of `VIOLATIONS`."""
    wall_s: float
    cpu_s: float = 0.0
    leftover_processes: int = 0
    signal: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def violation(self) -> bool:
        return self.reason in VIOLATIONS
