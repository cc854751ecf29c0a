"""Where a FrozenLake policy goes wrong: every state of many random maps, its greedy move classified.

For each checkpoint (a HF model dir: a run's `checkpoints/step_N`), `--maps` random 4x4 maps are
drawn from the env's own generator (holes p=0.2, start-goal path <= 8, as the example's
TinyFrozenLake), and for every state reachable from the start the prompt is built the way the
step-wise env manager builds it (chat template of the grid, then the forced `<answer>` prefix).
The greedy next token is classified:
- optimal: a move on a shortest hole-free path to the goal;
- hole: a move into a hole;
- detour: any other move to another cell; bump: a move into the edge (stays put);
- invalid: not an action token.
It also plays every map greedily from its start (at most 8 moves): `greedy_success`, comparable to
the run's `val/success` on more maps, and apart on the maps that need a detour (the shortest
hole-free path is longer than the Manhattan distance: some move must go away from the goal) and on
the direct ones. States with a hole next to the player are reported apart,
with the policy's mean probability of its hole move where it errs there (how sure it is).

    python benchmarks/learning/frozen_lake_errors.py output/frozen_lake_tiny/checkpoints/step_100 ... [--maps 400]

Last line: `RESULT <label>_greedy_success=... <label>_hole_error_next_to_hole=... ...` per checkpoint.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout


from envs.frozen_lake.env import observation_text
from envs.frozen_lake.maps import MOVES, find_cell, generate_map, goal_distances, needs_detour
from roll.agentic.env_manager.chat import ChatFormatter

ACTIONS = ("Left", "Down", "Right", "Up")
SIZE, HOLE_PROB, MAX_PATH, MAX_MOVES = 4, 0.2, 8, 8


def neighbour(pos: tuple[int, int], move: int) -> tuple[int, int]:
    row, col = pos[0] + MOVES[move][0], pos[1] + MOVES[move][1]
    return (row, col) if 0 <= row < SIZE and 0 <= col < SIZE else pos


@torch.no_grad()
def action_probs(model, tokenizer, chat: ChatFormatter, texts: list[str]) -> torch.Tensor:
    """Next-token probabilities (N, vocab) after each grid's prompt, left-padded into one batch."""
    prompts = [chat.template_ids([{"role": "user", "content": t}], True) + chat.prefix_ids for t in texts]
    width = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return model(input_ids=ids, attention_mask=mask).logits[:, -1].float().softmax(-1)


def classify(desc, dist, pos, move: int) -> str:
    if move < 0:
        return "invalid"
    target = neighbour(pos, move)
    if dist.get(target, 99) == dist[pos] - 1:
        return "optimal"
    if desc[target[0]][target[1]] == "H":
        return "hole"
    return "bump" if target == pos else "detour"


def plays_to_goal(desc, greedy: dict) -> bool:
    """Play the greedy moves from the start, at most MAX_MOVES: whether they reach the goal."""
    pos = find_cell(desc, "S")
    for _ in range(MAX_MOVES):
        if greedy.get(pos, -1) < 0:
            break
        pos = neighbour(pos, greedy[pos])
        if desc[pos[0]][pos[1]] in "HG":
            break
    return desc[pos[0]][pos[1]] == "G"


def evaluate(checkpoint: str, num_maps: int, seed: int, show_neighbours: bool = False) -> dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    chat = ChatFormatter(tokenizer, "<answer>")
    action_ids = [tokenizer.convert_tokens_to_ids(a) for a in ACTIONS]
    rng = np.random.default_rng(seed)
    kinds, near_hole, sure = collections.Counter(), collections.Counter(), []
    maps, wins = collections.Counter(), collections.Counter()
    for _ in range(num_maps):
        desc = generate_map(rng, SIZE, HOLE_PROB, MAX_PATH)
        dist = goal_distances(desc)
        states = [p for p in dist if desc[p[0]][p[1]] not in "HG"]
        probs = action_probs(model, tokenizer, chat, [observation_text(desc, p, show_neighbours) for p in states])
        greedy = {}
        for pos, p in zip(states, probs):
            top = int(p.argmax())
            move = action_ids.index(top) if top in action_ids else -1
            greedy[pos] = move
            kind = classify(desc, dist, pos, move)
            kinds[kind] += 1
            if any(desc[n[0]][n[1]] == "H" for n in (neighbour(pos, m) for m in range(4))):
                near_hole[kind] += 1
                if kind == "hole":
                    sure.append(float(p[top] / p[action_ids].sum()))
        kind = "detour" if needs_detour(desc, dist) else "direct"
        maps[kind] += 1
        wins[kind] += plays_to_goal(desc, greedy)
    total, total_near = sum(kinds.values()), sum(near_hole.values())
    out = {
        "greedy_success": sum(wins.values()) / num_maps,
        "detour_map_share": maps["detour"] / num_maps,
        "greedy_success_direct": wins["direct"] / max(maps["direct"], 1),
        "greedy_success_detour": wins["detour"] / max(maps["detour"], 1),
        "states": float(total),
        "next_to_hole_share": total_near / total,
        "hole_error_next_to_hole": near_hole["hole"] / total_near,
        "p_hole_move_when_wrong": float(np.mean(sure)) if sure else 0.0,
    }
    out.update({f"share_{k}": kinds[k] / total for k in ("optimal", "hole", "detour", "bump", "invalid")})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--maps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument(
        "--show_neighbours",
        action="store_true",
        help="prompts with the neighbour line (env_config show_neighbours, the example's default)",
    )
    args = parser.parse_args(argv)
    print(
        "| checkpoint | greedy success | optimal | hole | detour | bump | invalid | hole errors next to a hole "
        "| P(hole move) when wrong | detour maps | greedy success, direct / detour maps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    result = []
    for checkpoint in args.checkpoints:
        m = evaluate(checkpoint, args.maps, args.seed, args.show_neighbours)
        label = "_".join(Path(checkpoint).parts[-3:]).replace("-", "_")
        print(
            f"| {checkpoint} | {m['greedy_success']:.3f} | {m['share_optimal']:.3f} | {m['share_hole']:.3f} "
            f"| {m['share_detour']:.3f} | {m['share_bump']:.3f} | {m['share_invalid']:.3f} "
            f"| {m['hole_error_next_to_hole']:.3f} | {m['p_hole_move_when_wrong']:.2f} | {m['detour_map_share']:.3f} "
            f"| {m['greedy_success_direct']:.3f} / {m['greedy_success_detour']:.3f} |"
        )
        result += [
            f"{label}_greedy_success={m['greedy_success']:.3f}",
            f"{label}_hole_error_next_to_hole={m['hole_error_next_to_hole']:.3f}",
            f"{label}_greedy_success_detour={m['greedy_success_detour']:.3f}",
        ]
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
