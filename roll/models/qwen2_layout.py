"""A random-init model with Qwen2.5-Instruct's files, built locally: a stand-in for a real model dir.

Why: the tutorial "Train a real model on one GPU" (docs/tutorials/one_gpu.md) starts from a local
Qwen2.5-0.5B-Instruct directory, and neither CI nor a rehearsal on a CPU can download one. This
builds a directory of the same layout and kinds of files, only small and untrained:
- config.json: `model_type: qwen2` (`Qwen2ForCausalLM`, tied embeddings, grouped KV heads), its
  `vocab_size` padded past the tokenizer's length as Qwen's is (ids the tokenizer never makes);
- model.safetensors in bf16, as the hub's;
- tokenizer.json: a byte-level BPE (Qwen2's split pattern, NFC) trained here on a short corpus,
  with `<|endoftext|>` (pad), `<|im_start|>` and `<|im_end|>` (eos) as special tokens;
  tokenizer_config.json with Qwen2.5's chat template (a default system message; no tools branch);
- generation_config.json: two stop ids and sampling defaults, as Qwen2.5-Instruct's.

    python -m roll.models.qwen2_layout --output_dir ./output/models/qwen2-layout
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config, Qwen2Tokenizer

from roll.utils.atomic import atomic_dir

log = logging.getLogger(__name__)

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenizer split (numbers one digit a piece), before the byte-level mapping."""
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CORPUS = (
    "You are playing a game; answer with one action in <answer></answer>.",
    "You are on a frozen lake. Reach the goal G without falling into a hole O. Actions: Left, Down, Right, Up.",
    "<answer>Left</answer> <answer>Down</answer> <answer>Right</answer> <answer>Up</answer>",
    "The quick brown fox jumps over the lazy dog. 0123456789 Step 1; last 2 steps: [] Now: P_OG",
)
"""What the BPE merges are learned from: any text still encodes (byte-level), only in more tokens."""


def build_qwen2_tokenizer(corpus: Iterable[str] = CORPUS, vocab_size: int = 512) -> Qwen2Tokenizer:
    """A byte-level BPE with Qwen2's normalizer, split, decoder and special tokens (after the BPE
    vocabulary, as Qwen's are), trained on `corpus`; deterministic for a given corpus."""
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(list(corpus), trainer=trainer)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (ENDOFTEXT, IM_START, IM_END)])
    return Qwen2Tokenizer(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
    )


def build_qwen2_layout_model(
    output_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    corpus: Sequence[str] = CORPUS,
    seed: int = 0,
    overwrite: bool = False,
) -> str:
    """Build and save the directory (module docstring); return its absolute path. A dir that
    already has config.json is returned unchanged unless `overwrite`."""
    final = Path(output_dir).resolve()
    if (final / "config.json").is_file() and not overwrite:
        return str(final)
    tokenizer = build_qwen2_tokenizer(corpus)
    vocab = tokenizer.get_vocab()
    endoftext, im_end = vocab[ENDOFTEXT], vocab[IM_END]
    config = Qwen2Config(
        vocab_size=-(-len(tokenizer) // 128) * 128,  # padded as Qwen's (151,936 rows for 151,665 tokens)
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext,
        eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext,
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
    )
    with atomic_dir(final) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    log.info("built a random-init Qwen2 layout (vocab %d) at %s", config.vocab_size, final)
    return str(final)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m roll.models.qwen2_layout", description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    path = build_qwen2_layout_model(args.output_dir, seed=args.seed, overwrite=args.overwrite)
    print(path)
    return path


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
