"""Curves from metrics.jsonl: exact series (step and wall time) and a real PNG of the right size."""

import json
import struct

import pytest

from roll.tracking.plot import main, plot_metrics, read_metrics, series

RECORDS = [
    {"step": 1, "time/step_s": 2.0, "train/success": 0.5, "losses/entropy": 1.5},
    {"step": 1, "val/success": 1.0},  # validation logged in its own call
    {"step": 2, "time/step_s": 3.0, "train/success": 1.0, "losses/entropy": 1.25},
]


def write_jsonl(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def png_size(path):
    """(width, height) from the PNG signature and IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_series_by_step_and_by_elapsed_time():
    assert series(RECORDS, "train/success") == ([1.0, 2.0], [0.5, 1.0])
    assert series(RECORDS, "train/success", x="time") == ([2.0, 5.0], [0.5, 1.0])
    assert series(RECORDS, "val/success", x="time") == ([2.0], [1.0])
    assert series(RECORDS, "losses/approx_kl") == ([], [])


def test_a_torn_last_line_is_skipped(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", RECORDS, tail='{"step": 3, "tra')
    assert read_metrics(tmp_path) == RECORDS


def test_plot_writes_a_png_beside_the_metrics(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", RECORDS)
    out = plot_metrics(tmp_path)
    assert out == str(tmp_path / "curves.png")
    assert png_size(tmp_path / "curves.png") == (1500, 400)  # figsize (15, 4) at 100 dpi
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_cli_plots_by_time_with_missing_keys(tmp_path, capsys):
    path = write_jsonl(tmp_path / "m.jsonl", [{"step": 1, "train/success": 0.0}])
    main([str(path), "--out", str(tmp_path / "plots" / "c.png"), "--x", "time"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "plots" / "c.png")
    assert png_size(tmp_path / "plots" / "c.png") == (1500, 400)


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    write_jsonl(tmp_path / "metrics.jsonl", RECORDS)
    with pytest.raises(ValueError, match="x must be one of"):
        plot_metrics(tmp_path, x="epoch")
