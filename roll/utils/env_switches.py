"""On/off switches read from the driver's environment (`ROLL_GC_FREEZE`, `ROLL_SCORE_IN_TURNS`).

A switch is on unless its variable says "0", "false", "no" or "off" (any case, spaces ignored);
unset means on. They exist to compare a run with and without a saving, not as configuration.
"""

from __future__ import annotations

import os

OFF = ("0", "false", "no", "off")


def switched_on(name: str) -> bool:
    """False when the environment variable `name` is one of `OFF`; True otherwise (unset included)."""
    return os.environ.get(name, "1").strip().lower() not in OFF
