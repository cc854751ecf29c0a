"""benchmarks/gpu/phase_floors.py: each phase's floor from a run's metrics and the device's facts,
against numbers worked out by hand; the facts measured on this CPU are positive and consistent."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.gpu import phase_floors

REPO = Path(__file__).resolve().parents[2]

# 1e6 matmul parameters, 4e6 bytes of weights, a 1e12 FLOP/s peak (5e11 at 50%), 1e9 B/s copies,
# 1000 tokens/s of decode floor.
FACTS = {
    "matmul_params": 1e6,
    "weight_bytes": 4e6,
    "peak_flops": 1e12,
    "copy_bytes_per_s": 1e9,
    "decode_tokens_per_s": 1000.0,
}
# two steps: 500 and 700 generated tokens (mean 600), 100 tokens an episode x 10 trajectories
STEPS = [
    {"rollout/generated_tokens": 500, "train/tokens_per_episode": 100, "rollout/kept_trajectories": 10,
     "time/rollout_s": 1.0, "time/score_s": 0.01, "time/train_s": 0.1, "time/sync_s": 0.008, "time/step_s": 1.2},
    {"rollout/generated_tokens": 700, "train/tokens_per_episode": 100, "rollout/kept_trajectories": 10,
     "time/rollout_s": 1.4, "time/score_s": 0.01, "time/train_s": 0.1, "time/sync_s": 0.008, "time/step_s": 1.6},
]  # fmt: skip


def test_floors_by_hand():
    out = phase_floors.phase_floors(STEPS, FACTS, ppo_epochs=2)
    # rollout 600 / 1000 = 0.6 s; score 2 * 1e6 * 1000 / 5e11 = 0.004 s;
    # train 6 * 1e6 * 1000 * 2 / 5e11 = 0.024 s; sync 4e6 / 1e9 = 0.004 s; sum 0.632 s
    assert out["floor_s"] == {"rollout": 0.6, "score": 0.004, "train": 0.024, "sync": 0.004}
    assert out["measured_s"]["rollout"] == pytest.approx(1.2)
    assert out["phase_floor_ratio"] == {
        "rollout": 2.0,
        "score": 2.5,
        "train": round(0.1 / 0.024, 3),
        "sync": 2.0,
        "step": round(1.4 / 0.632, 3),
    }
    assert phase_floors.phase_floors([], FACTS) == {}


def test_matmul_parameters_of_a_qwen2_shape_by_hand():
    # Qwen2-0.5B: h 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864, vocab 151936
    config = SimpleNamespace(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936,
    )  # fmt: skip
    per_layer = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    assert phase_floors.matmul_params(config) == 24 * per_layer + 151936 * 896


def test_device_facts_on_this_cpu(tmp_path):
    from roll.models.tiny import build_tiny_model

    model = build_tiny_model(str(tmp_path / "m"), corpus=["You are P."], seed=3)
    facts = phase_floors.device_facts(model, batch=4, dtype="float32", device="cpu")
    assert facts["weight_bytes"] > 0 and facts["matmul_params"] > 0 and facts["decode_batch"] == 4
    assert all(facts[k] > 0 for k in ("peak_flops", "copy_bytes_per_s", "decode_tokens_per_s"))
