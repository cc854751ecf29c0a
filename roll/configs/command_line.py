"""How a command line names a config: `--config_path DIR --config_name NAME [hydra overrides ...]`,
and where DIR is looked up (as given, or under a second directory such as examples/). Shared by
the training CLI (`roll.cli`) and the tools that load a run's config the same way."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from roll.configs.base import ConfigError


def parse_config_args(argv: Sequence[str] | None, prog: str, description: str) -> argparse.Namespace:
    """`--config_path`, `--config_name` and hydra overrides, in any order (the CLIs' common part)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config_path", required=True, help="directory of the YAML")
    parser.add_argument("--config_name", required=True, help="YAML file name, without .yaml")
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. max_steps=10")
    return parser.parse_intermixed_args(argv)


def resolve_config_dir(config_path: str, examples_dir: str | None) -> str:
    """`config_path` as given if it is a directory (absolute or relative to the current
    directory), else relative to `examples_dir`; raises `ConfigError` when neither exists."""
    candidates = [config_path]
    if examples_dir is not None and not os.path.isabs(config_path):
        candidates.append(os.path.join(examples_dir, config_path))
    for candidate in candidates:
        if os.path.isdir(candidate):
            return os.path.abspath(candidate)
    looked_in = ", ".join(os.path.abspath(candidate) for candidate in candidates)
    raise ConfigError("config_path", f"no directory {config_path!r} (looked in: {looked_in})")
