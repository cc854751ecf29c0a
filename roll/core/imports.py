"""Import an object named `package.module:Name`, the form configs use for user classes (envs,
agents), telling "that module does not exist" apart from "that module is broken"."""

from __future__ import annotations

import importlib
from typing import Any


class ObjectNotFound(LookupError):
    """The module or the attribute a `module:Name` path names does not exist; the message says
    which, in a few words that callers put in their own one-line error."""


def import_object(path: str) -> Any:
    """`Name` of module `package.module`, for `path` = "package.module:Name".

    A missing module or attribute raises `ObjectNotFound`. A module that exists but fails on one of
    its own imports re-raises that ModuleNotFoundError untouched: the user's code needs a package,
    and hiding that behind "unknown name" would send them looking in the wrong place.
    """
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name and not module_name.startswith(f"{e.name}."):
            raise
        raise ObjectNotFound(f"no module {module_name!r}") from None
    if not hasattr(module, attr):
        raise ObjectNotFound(f"module {module_name!r} has no {attr!r}")
    return getattr(module, attr)
