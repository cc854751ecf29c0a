"""The answer roll gives to one field of ROLL's config dataclasses (`roll.configs.roll_compat.table`).

An `Answer` is data: what roll does with the field, and why. Three kinds:
- "supported": a field of roll's own config at the same place, with the meaning its docstring
  gives there (`why` says it in a line, and where roll differs);
- "no-op": accepted with any value and dropped before validation, because nothing roll runs would
  behave differently (`why` says why that is safe);
- "refused": accepted only with a value in `off` (the feature switched off, also a no-op); any other
  value is a one-line config error naming the key and `why`.
`section` names the ROLL classes of a nested mapping (`model_args` -> ModelArguments): its fields
are answered by those classes' tables in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["supported", "no-op", "refused"]
UNSET: tuple[Any, ...] = (None, False, 0, 0.0, "", [], {})
"""Values that switch a refused feature off unless an entry says otherwise: absent, false, zero, empty."""


@dataclass(frozen=True)
class Answer:
    kind: Kind
    why: str
    off: tuple[Any, ...] = ()
    section: tuple[str, ...] = ()

    def accepts(self, value: Any) -> bool:
        """Whether `value` passes this answer (refused features: only their off values)."""
        if self.kind != "refused":
            return True
        return any(type(value) is type(off) and value == off for off in self.off) or (
            value is None and None in self.off
        )


def ok(why: str, section: tuple[str, ...] = ()) -> Answer:
    """A ROLL field that roll's config has, with the meaning `why` states."""
    return Answer("supported", why, section=section)


def noop(why: str, section: tuple[str, ...] = ()) -> Answer:
    """A ROLL field accepted and ignored, `why` saying why that is safe."""
    return Answer("no-op", why, section=section)


def refused(why: str, off: tuple[Any, ...] = UNSET) -> Answer:
    """A ROLL feature roll does not run: accepted only when `off`."""
    return Answer("refused", why, off=off)
