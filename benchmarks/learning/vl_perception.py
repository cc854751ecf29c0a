"""Can a tiny VL model see the lake? The shortest-path move read from the frame, learnt supervised.

Not RL: a check of what the model can represent. For each `--rope_theta`, the tiny VL model of
the `vl_frozen_lake` preset (random init, the same seed) with that RoPE base is trained with
cross-entropy on the answer token after the VL step prompt (`VLStepEnvManager`'s layout: the
frame alone, then `<answer>`), the label being the env's `scripted_action` (the next move of a
shortest path round the holes). Training states: 600 maps, each walked by the expert with 30%
random moves mixed in; held-out states: the expert's path on 100 other maps. Held-out accuracy
every `--eval_every` updates of 32 states, all settings in one run, side by side. Chance is about
0.27 (the most common move). The text model does this to 0.96 (shared/notes/frozenlake-learning.md).

    python benchmarks/learning/vl_perception.py [--rope_theta 1e6 10 1] [--steps 400]

Last line: `RESULT vl_perception theta_<t>=<final held-out accuracy> ...`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout


import envs  # noqa: F401  registers the built-ins
from roll.agentic.env.registry import make_env
from roll.models.loading import load_policy, load_processor
from roll.pipeline.tiny_model import main as build_tiny

ENV = dict(size=4, hole_prob=0.2, is_slippery=False, max_path_length=8, show_neighbours=False, render_mode="rgb_array")
PROMPT = [
    {"role": "user", "content": [{"type": "text", "text": "\n"}, {"type": "image"}, {"type": "text", "text": "\n"}]}
]


def states(seed: int, rng: random.Random, explore: float) -> list[tuple]:
    """(frame, expert move) along one map's episode, `explore` of the moves played at random."""
    env = make_env("frozen_lake", ENV)
    env.reset(seed=seed)
    found = []
    for _ in range(8):
        expert = env.scripted_action()
        if expert is None:
            break
        found.append((env.render(), expert.removeprefix("<answer>").removesuffix("</answer>")))
        move = f"<answer>{rng.choice(env.actions)}</answer>" if rng.random() < explore else expert
        _, _, terminated, truncated, _ = env.step(move)
        if terminated or truncated:
            break
    return found


def train_one(model_dir: str, theta: float, data: tuple, args) -> list[tuple[int, float]]:
    config_path = Path(model_dir) / "config.json"
    config = json.loads(config_path.read_text())
    config["text_config"]["rope_parameters"]["rope_theta"] = theta
    config_path.write_text(json.dumps(config))
    processor, model = load_processor(model_dir), load_policy(model_dir)
    text = processor.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False) + "<answer>"
    train, test = data
    ids = {a: processor.tokenizer.encode(a, add_special_tokens=False)[0] for a in {a for _, a in train}}

    def batch(items):
        enc = processor(text=[text] * len(items), images=[f for f, _ in items], return_tensors="pt")
        return enc, torch.tensor([ids[a] for _, a in items])

    def accuracy() -> float:
        model.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, len(test), 64):
                enc, y = batch(test[i : i + 64])
                right += int((model(**enc).logits[:, -1].argmax(-1) == y).sum())
        model.train()
        return right / len(test)

    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99))
    curve = [(0, accuracy())]
    for step in range(1, args.steps + 1):
        enc, y = batch(rng.sample(train, 32))
        loss = torch.nn.functional.cross_entropy(model(**enc).logits[:, -1], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.eval_every == 0:
            curve.append((step, accuracy()))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rope_theta", type=float, nargs="+", default=[1e6, 10.0, 1.0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval_every", type=int, default=50)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    train = [s for seed in range(1000, 1600) for s in states(seed, rng, 0.3)]
    test = [s for seed in range(100) for s in states(seed, rng, 0.0)]
    print(f"{len(train)} training states, {len(test)} held-out states", flush=True)
    results = {}
    for theta in args.rope_theta:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_tiny(["--preset", "vl_frozen_lake", "--output_dir", f"{tmp}/m"])
            started = time.perf_counter()
            curve = train_one(model_dir, theta, (train, test), args)
        results[theta] = curve
        print(
            f"rope_theta {theta:g}: held-out accuracy "
            + " ".join(f"{acc:.3f}@{step}" for step, acc in curve)
            + f" ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    print("| rope_theta | " + " | ".join(f"step {s}" for s, _ in results[args.rope_theta[0]]) + " |")
    print("|---|" + "---|" * len(results[args.rope_theta[0]]))
    for theta, curve in results.items():
        print(f"| {theta:g} | " + " | ".join(f"{acc:.3f}" for _, acc in curve) + " |")
    print("RESULT vl_perception " + " ".join(f"theta_{t:g}={c[-1][1]:.3f}" for t, c in results.items()))


if __name__ == "__main__":
    main()
