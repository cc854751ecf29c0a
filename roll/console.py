"""The `roll` console script: the same CLI as `python examples/start_agentic_pipeline.py`.

`roll --config_path DIR --config_name NAME [key=value ...]` calls `roll.cli.main`. A relative
`DIR` is looked up in the current directory first, then in the repository's `examples/` folder
when roll is installed from a checkout (`pip install -e .`), so `roll --config_path frozen_lake
--config_name agent_val_frozen_lake` works from anywhere inside or outside the checkout.
"""

import sys
from pathlib import Path

from roll.cli import main as cli_main


def examples_dir() -> str | None:
    """The checkout's `examples/` folder beside the `roll` package, if there is one."""
    candidate = Path(__file__).resolve().parent.parent / "examples"
    return str(candidate) if candidate.is_dir() else None


def main() -> int:
    """Entry point of the `roll` console script; returns the process exit status."""
    return cli_main(sys.argv[1:], examples_dir=examples_dir())
