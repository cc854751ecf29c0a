"""Write the small MATH-format sample set shipped with this example (`data/train.jsonl`,
`data/val.jsonl`): arithmetic and one-step algebra word problems with `\\boxed{}` solutions, in the
fields of MATH / MATH-lighteval (`problem`, `solution`, `level`, `type`). Our own making, so the
example needs no download; deterministic (same --seed, same files).

    python examples/math_agent/make_sample_data.py            # rewrites data/{train,val}.jsonl
    python examples/math_agent/preprocess.py data/train.jsonl  # -> data/train_agent.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("Tom", "Ana", "Lee", "Sam", "Mia")
ITEMS = ("apples", "pens", "books", "coins", "cards")


def _frac(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"\\frac{{{x.numerator}}}{{{x.denominator}}}"


def _add(r):
    a, b = r.randint(2, 99), r.randint(2, 99)
    return f"What is ${a} + {b}$?", f"${a} + {b} = \\boxed{{{a + b}}}$.", 1, "Prealgebra"


def _story(r):
    name, item, a, b = r.choice(NAMES), r.choice(ITEMS), r.randint(5, 60), r.randint(2, 40)
    if r.random() < 0.5:
        return (
            f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            f"{name} has ${a} + {b} = \\boxed{{{a + b}}}$ {item}.",
            1,
            "Prealgebra",
        )
    a += b
    return (
        f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
        f"There are ${a} - {b} = \\boxed{{{a - b}}}$ {item} left.",
        1,
        "Prealgebra",
    )


def _boxes(r):
    item, a, b = r.choice(ITEMS), r.randint(2, 12), r.randint(2, 12)
    return (
        f"A box holds {a} {item}. How many {item} are in {b} boxes?",
        f"There are ${a} \\times {b} = \\boxed{{{a * b}}}$ {item}.",
        2,
        "Prealgebra",
    )


def _linear(r):
    a, x = r.randint(2, 9), r.randint(-9, 12)
    b = r.randint(1, 20)
    if r.random() < 0.5:
        return (
            f"Solve for $x$: ${a}x + {b} = {a * x + b}$.",
            f"Subtract ${b}$ from both sides: ${a}x = {a * x}$, so $x = \\boxed{{{x}}}$.",
            2,
            "Algebra",
        )
    return (
        f"Solve for $x$: ${a}x - {b} = {a * x - b}$.",
        f"Add ${b}$ to both sides: ${a}x = {a * x}$, so $x = \\boxed{{{x}}}$.",
        2,
        "Algebra",
    )


def _mixed(r):
    a, b, c = r.randint(2, 20), r.randint(2, 12), r.randint(1, 50)
    return (
        f"What is ${a} \\times {b} - {c}$?",
        f"${a} \\times {b} - {c} = {a * b} - {c} = \\boxed{{{a * b - c}}}$.",
        2,
        "Prealgebra",
    )


def _fraction(r):
    x, y = Fraction(r.randint(1, 5), r.randint(2, 6)), Fraction(r.randint(1, 5), r.randint(2, 6))
    return (
        f"What is ${_frac(x)} + {_frac(y)}$? Express your answer as a common fraction.",
        f"${_frac(x)} + {_frac(y)} = \\boxed{{{_frac(x + y)}}}$.",
        3,
        "Prealgebra",
    )


KINDS = (_add, _story, _boxes, _linear, _mixed, _fraction)


def make_rows(n: int, seed: int) -> list[dict]:
    r = random.Random(seed)
    rows = []
    for i in range(n):
        problem, solution, level, kind = KINDS[i % len(KINDS)](r)
        rows.append({"problem": problem, "solution": solution, "level": f"Level {level}", "type": kind})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", default=str(HERE / "data"))
    parser.add_argument("--num_train", type=int, default=240)
    parser.add_argument("--num_val", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", args.num_train, args.seed), ("val", args.num_val, args.seed + 1)):
        with open(out / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in make_rows(n, seed))
        print(out / f"{split}.jsonl")


if __name__ == "__main__":
    main()
