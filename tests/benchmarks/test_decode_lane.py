"""The decode lane (benchmarks/gpu/decode_lane.py) on CPU: the smoke run measures every figure the GPU
record holds (floor, engine, generate, the ratios, the slots' own step, nano-vllm's shape) with the
same code, and numbers its records so a second run of the day keeps the first."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu import decode_lane

REPO = Path(__file__).resolve().parents[2]


def test_smoke_record_holds_every_figure(tmp_path):
    out = tmp_path / "decode.json"
    assert decode_lane.main(["--smoke", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["static_decode"] is True and [b["batch"] for b in record["batches"]] == [2, 4]
    for b in record["batches"]:
        assert {"tokens_per_s", "floor_tokens_per_s", "ratio_to_floor", "generate_tokens_per_s"} <= set(b)
        assert b["ratio_to_floor"] == b["tokens_per_s"] / b["floor_tokens_per_s"] > 0
        assert b["engine_step_ms"] > 0
    nano = record["nano_vllm_shape"]
    assert nano["requests"] == 8 and nano["generated_tokens"] > 8 * 10 - 1  # outputs of 10-30 tokens, no stop id


def test_a_second_record_of_the_day_gets_its_own_file(tmp_path):
    first = decode_lane.new_record_path(tmp_path)
    first.write_text("{}")
    assert decode_lane.new_record_path(tmp_path).name == first.name.replace(".json", "-2.json")
