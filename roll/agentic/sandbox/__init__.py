"""Sandboxed commands for tool envs: a per-episode workspace, isolation, limits and cleanup.

`Sandbox` (sandbox.py) runs shell and Python commands; `SandboxLimits` / `CommandResult`
(limits.py) are its data; isolation.py says what each isolation guarantees; launcher.py is the
stdlib-only process that applies it. Stdlib only, so any floor may use it. See docs/sandbox.md.
"""

from roll.agentic.sandbox.limits import VIOLATIONS, CommandResult, SandboxLimits
from roll.agentic.sandbox.sandbox import Sandbox

__all__ = ["VIOLATIONS", "CommandResult", "Sandbox", "SandboxLimits"]
