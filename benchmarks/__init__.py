"""The benchmark scripts, grouped by what they measure (benchmarks/README.md). Run a script by its path
from anywhere, e.g. `python benchmarks/rollout/rollout_throughput.py`; shared helpers are in `common`."""
