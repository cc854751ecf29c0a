"""One PPO training step through our ActorWorker vs the same step written as a raw torch loop.

The batch is shaped like a trajectory-wise FrozenLake batch (`--rows` right-padded conversations
of random ids, a generated token every `--turn_len` positions, random advantages and old
log-probs); one step is one optimizer step over it in micro-batches of `--micro_batch` rows.
Variants, in turns within each repeat, from the same weights: a raw torch loop (forward,
log_softmax, PPO-clip minus entropy, backward, clip, AdamW); `ActorWorker.train` with row dedupe
off (the fair row) and on (the default); the worker as a Ray actor. `--threads` torch threads
(default 1). A variant's time is the best of `--repeats`; the script also prints how far apart
the raw loop's and the worker's weights end up.

    python benchmarks/training/train_overhead.py \
        [--rows 128 --micro_batch 64 --min_len 100 --max_len 300 --threads 1 --repeats 3]

The last line is `RESULT train_overhead=<x> train_overhead_dedupe=<y>`: our time / raw time - 1
(in-process worker); the target is <= 0.10. The method in full, and every run:
benchmarks/results/train_overhead.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import ray
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from tensordict import TensorDict

from benchmarks.common import load_line, timed
from roll.algorithms.actor_loss import PolicyLossOptions
from roll.algorithms.pg_variants import PGOptions
from roll.configs.worker import TrainingArgs
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.common import shuffled_minibatches
from roll.models.loading import load_causal_lm
from roll.models.tiny import build_tiny_model
from roll.pipeline.setup.builders import init_ray
from roll.pipeline.tiny_model import env_corpus

SEED = 0
PPO = {"temperature": 1.0, "pg_clip": 0.2, "entropy_loss_coef": 0.01, "loss_agg_mode": "token-mean"}
LOSS = PolicyLossOptions(
    temperature=PPO["temperature"],
    pg=PGOptions(clip_low=PPO["pg_clip"], clip_high=PPO["pg_clip"]),
    entropy_coef=PPO["entropy_loss_coef"],
    agg_mode=PPO["loss_agg_mode"],
)


def conversation_batch(rows: int, min_len: int, max_len: int, turn_len: int, vocab_size: int) -> TensorDict:
    """Right-padded rows of random ids; every `turn_len`-th real token is a generated one."""
    gen = torch.Generator().manual_seed(SEED)
    lengths = torch.randint(min_len, max_len + 1, (rows,), generator=gen)
    positions = torch.arange(max_len)
    attention_mask = (positions[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(1, vocab_size, (rows, max_len), generator=gen) * attention_mask
    response_mask = ((positions % turn_len == turn_len - 1)[None, :] & attention_mask.bool()).float()
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "advantages": torch.randn(rows, 1, generator=gen) * response_mask,
            "old_logprobs": -torch.rand(rows, max_len, generator=gen) * 4 * response_mask,
        },
        batch_size=[rows],
    )


class RawTorchStep:
    """What one would write by hand: AdamW and a PPO-clip loss around the bare HF model."""

    def __init__(self, model_path: str, args: TrainingArgs):
        self.model = load_causal_lm(model_path).train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            weight_decay=args.weight_decay,
        )
        self.micro_batch = args.per_device_train_batch_size
        self.max_grad_norm = args.max_grad_norm

    def train(self, batch: TensorDict, step: int) -> None:
        # ActorWorker's row order for this step, so both see the same micro-batches
        (minibatch,) = shuffled_minibatches(batch, len(batch), SEED, "minibatch", step, 0)
        total_tokens = minibatch["response_mask"].sum()
        for start in range(0, len(minibatch), self.micro_batch):
            micro = minibatch[start : start + self.micro_batch]
            length = int(micro["attention_mask"].sum(dim=1).max())
            micro = micro.apply(lambda x, n=length: x[:, :n])
            loss = self._token_loss_sum(micro) / total_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _token_loss_sum(self, micro: TensorDict) -> torch.Tensor:
        """Sum over response tokens of (PPO-clip loss - entropy coef * entropy)."""
        ids, mask = micro["input_ids"], micro["attention_mask"]
        logits = self.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float() / PPO["temperature"]
        log_probs = F.log_softmax(logits, dim=-1)
        logprobs = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        response = micro["response_mask"][:, 1:]
        ratio = torch.exp(logprobs - micro["old_logprobs"][:, 1:])
        advantages = micro["advantages"][:, 1:]
        clip = PPO["pg_clip"]
        pg = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip))
        return ((pg - PPO["entropy_loss_coef"] * entropy) * response).sum()


def measure(variants: dict, batch: TensorDict, repeats: int) -> dict[str, float]:
    """Best seconds per variant; step 0 of each is an untimed warm-up."""
    for train in variants.values():
        train(batch, 0)
    best: dict[str, float] = {}
    for step in range(1, repeats + 1):
        for name, train in variants.items():
            seconds = timed(train, batch, step)
            best[name] = min(seconds, best.get(name, seconds))
    return best


def max_weight_diff(raw: RawTorchStep, worker: ActorWorker) -> float:
    ours = worker.get_weights()
    return max(float((p.detach() - ours[k]).abs().max()) for k, p in raw.model.state_dict().items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128, help="rows in the batch (one PPO mini-batch)")
    parser.add_argument("--micro_batch", type=int, default=64, help="rows per forward/backward")
    parser.add_argument("--min_len", type=int, default=100)
    parser.add_argument("--max_len", type=int, default=300)
    parser.add_argument("--turn_len", type=int, default=31, help="tokens per turn (one generated)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every variant")
    parser.add_argument("--no_ray", action="store_true", help="skip the Ray actor row")
    args = parser.parse_args()
    load = load_line()  # read now, printed with the table
    training_args = TrainingArgs(
        learning_rate=1e-4,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=-(-args.rows // args.micro_batch),
    )
    total_steps = args.repeats + 1
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "tiny", corpus=env_corpus("frozen_lake", {}))
        workers = {
            dedupe: ActorWorker(
                path,
                training_args,
                total_train_steps=total_steps,
                seed=SEED,
                num_threads=args.threads,
                dedupe_rows=dedupe,
            )
            for dedupe in (False, True)
        }
        raw = RawTorchStep(path, training_args)
        batch = conversation_batch(args.rows, args.min_len, args.max_len, args.turn_len, raw.model.config.vocab_size)
        variants = {
            "raw torch": raw.train,
            "ActorWorker, dedupe off": lambda b, s: workers[False].train(b, LOSS, ppo_epochs=1, step=s),
            "ActorWorker, dedupe on": lambda b, s: workers[True].train(b, LOSS, ppo_epochs=1, step=s),
        }
        if not args.no_ray:
            init_ray(None)
            # the actor options of roll.pipeline.setup.builders.build_workers
            actor = (
                ray.remote(ActorWorker)
                .options(num_cpus=0)
                .remote(
                    path,
                    training_args,
                    total_train_steps=total_steps,
                    seed=SEED,
                    num_threads=args.threads,
                    dedupe_rows=False,
                )
            )
            variants["ActorWorker via Ray, dedupe off"] = lambda b, s: ray.get(
                actor.train.remote(b, LOSS, ppo_epochs=1, step=s)
            )
        try:
            best = measure(variants, batch, args.repeats)
        finally:
            if not args.no_ray:
                ray.shutdown()
    tokens = int(batch["attention_mask"].sum())
    print(
        f"{args.rows} rows ({tokens} tokens, {args.min_len}..{args.max_len} per row), micro-batches of "
        f"{args.micro_batch}, one optimizer step; best of {args.repeats}; {torch.get_num_threads()} torch threads, "
        f"{load}"
    )
    print(f"{'variant':34}{'step s':>9}{'tokens/s':>10}{'vs raw':>9}")
    for name, seconds in best.items():
        print(f"{name:34}{seconds:9.3f}{tokens / seconds:10.0f}{seconds / best['raw torch']:8.2f}x")
    print(
        f"max |weight difference| raw vs ActorWorker (dedupe off) after {total_steps} identical steps: "
        f"{max_weight_diff(raw, workers[False]):.2e}"
    )
    raw_s = best["raw torch"]
    print(
        f"RESULT train_overhead={best['ActorWorker, dedupe off'] / raw_s - 1:.3f} "
        f"train_overhead_dedupe={best['ActorWorker, dedupe on'] / raw_s - 1:.3f}"
    )


if __name__ == "__main__":
    main()
