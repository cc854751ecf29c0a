"""Training curves of a run from its metrics.jsonl: success, reward, KL and entropy, as a PNG.

    python -m roll.tracking.plot output/frozen_lake [--out curves.png] [--x step|time]

Works on a run still in progress (a torn last line is skipped) and on runs that lack some keys
(no critic, no validation, KL off): a missing curve is left out, an empty panel says "no data".
x = time is wall-clock seconds, the running sum of `time/step_s`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from matplotlib.figure import Figure  # a bare Figure renders with Agg; no pyplot global state

from roll.tracking.tracker import METRICS_FILE

XAxis = Literal["step", "time"]
# (title, keys on the left axis, keys on a right axis): entropy (~1) dwarfs KL (~1e-3).
PANELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("success", ("train/success", "val/success"), ()),
    ("episode reward", ("train/episode_reward",), ()),
    ("KL and entropy", ("losses/approx_kl",), ("losses/entropy",)),
)
X_LABELS = {"step": "training step", "time": "wall time (s)"}


def metrics_file(path: str | os.PathLike[str]) -> Path:
    """The metrics.jsonl named by `path`, which is that file or the run's output_dir."""
    path = Path(path)
    return path / METRICS_FILE if path.is_dir() else path


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The records of a metrics.jsonl in file order; lines that do not parse are skipped."""
    records = []
    for line in metrics_file(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def series(records: Sequence[dict[str, float]], key: str, x: XAxis = "step") -> tuple[list[float], list[float]]:
    """(xs, ys) of `key` over the records that have it; x is the step or the time elapsed after
    that record (the sum of `time/step_s` so far)."""
    xs, ys, elapsed = [], [], 0.0
    for record in records:
        elapsed += record.get("time/step_s", 0.0)
        if key in record:
            xs.append(float(record["step"]) if x == "step" else elapsed)
            ys.append(float(record[key]))
    return xs, ys


def _draw(ax, records, keys, x, style, first_color=0) -> list:
    lines = []
    for i, key in enumerate(keys, start=first_color):
        xs, ys = series(records, key, x)
        if xs:
            marker = "o" if key.startswith("val/") else None  # validation points are sparse
            lines += ax.plot(xs, ys, style, color=f"C{i}", marker=marker, markersize=3, label=key)
    return lines


def plot_metrics(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, x: XAxis = "step") -> str:
    """Draw the three panels of `path` (a metrics.jsonl or run dir) into the PNG `out` (default:
    curves.png beside the metrics); return the PNG's path."""
    if x not in X_LABELS:
        raise ValueError(f"x must be one of {sorted(X_LABELS)}, not {x!r}")
    source = metrics_file(path)
    records = read_metrics(source)
    out = Path(out) if out is not None else source.with_name("curves.png")
    fig = Figure(figsize=(15, 4), layout="constrained")
    fig.suptitle(f"{source.parent.name} ({len(records)} records)")
    for ax, (title, left, right) in zip(fig.subplots(1, len(PANELS)), PANELS):
        lines = _draw(ax, records, left, x, "-")
        if any(series(records, key, x)[0] for key in right):
            lines += _draw(ax.twinx(), records, right, x, "--", first_color=len(left))
        ax.set_title(title)
        ax.set_xlabel(X_LABELS[x])
        if lines:
            ax.legend(lines, [line.get_label() for line in lines], fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return str(out)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m roll.tracking.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a run's output_dir or its metrics.jsonl")
    parser.add_argument("--out", help="PNG to write (default: curves.png beside metrics.jsonl)")
    parser.add_argument("--x", choices=sorted(X_LABELS), default="step")
    args = parser.parse_args(argv)
    if not metrics_file(args.path).is_file():
        parser.error(f"no metrics file at {metrics_file(args.path)}")
    out = plot_metrics(args.path, args.out, x=args.x)
    print(out)
    return out


if __name__ == "__main__":
    main()
