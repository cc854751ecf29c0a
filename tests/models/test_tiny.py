"""The tiny model builder and loaders: exact tokenization, chat ids, offline loading, seeding."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import envs  # noqa: F401  registers the built-ins (the entry point may not be installed)
from roll.models.chat_template import chat_template_ids
from roll.models.loading import (
    load_causal_lm,
    load_tokenizer,
    load_value_model,
)
from roll.models.tiny import build_tiny_model, build_tiny_tokenizer
from roll.pipeline.tiny_model import env_corpus, main

# Defaults: tied embeddings, so params = 128 * V + 2 layers * (attention 4 * 128 * 128 + MLP
# 3 * 128 * 512 + two RMSNorms 2 * 128) + final norm 128 = 128 * V + 524928.
BODY_PARAMS = 2 * (4 * 128 * 128 + 3 * 128 * 512 + 2 * 128) + 128


def tokens(tokenizer, text):
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


@pytest.fixture(scope="module")
def lake_corpus():
    return env_corpus("frozen_lake", {})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", corpus=["You are on ice."])


def test_grid_rows_are_one_token_per_cell_and_decode_readably():
    tok = build_tiny_tokenizer()
    ids = tok("P_O_\n__G_")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["P", "_", "O", "_", "\n", "_", "_", "G", "_"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == "P _ O _\n_ _ G _"


def test_unknown_words_are_unk_and_corpus_words_are_whole_tokens():
    tok = build_tiny_tokenizer(corpus=["You are on ice."])
    assert tokens(tok, "You are on thin ice.") == ["You", "are", "on", "<unk>", "ice", "."]
    assert tokens(tok, "Swim Left") == ["<unk>", "Left"]


def test_special_ids_and_sorted_corpus_ids_are_fixed():
    tok = build_tiny_tokenizer(corpus=["zeta alpha", "Beta alpha"])
    assert tok.convert_tokens_to_ids(["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]) == [
        0,
        1,
        2,
        3,
    ]
    assert (tok.pad_token_id, tok.unk_token_id, tok.eos_token_id, tok.bos_token) == (0, 1, 3, None)
    base = len(build_tiny_tokenizer())
    assert len(tok) == base + 3
    assert tok.convert_ids_to_tokens([base, base + 1, base + 2]) == ["Beta", "alpha", "zeta"]


def test_extra_tokens_are_whole_tokens_after_the_base_vocabulary():
    base = len(build_tiny_tokenizer())
    tok = build_tiny_tokenizer(corpus=["think about it"], extra_tokens=["<think>", "</think>"])
    assert tok.convert_ids_to_tokens(list(range(base, len(tok)))) == [
        "<think>",
        "</think>",
        "about",
        "it",
        "think",
    ]
    assert tokens(tok, "<think>think</think>Up") == ["<think>", "think", "</think>", "Up"]


def test_answer_tags_survive_skipping_special_tokens():
    tok = build_tiny_tokenizer()
    ids = tok("<answer>Left</answer><|im_end|>")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<answer>", "Left", "</answer>", "<|im_end|>"]
    assert tok.decode(ids, skip_special_tokens=True) == "<answer> Left </answer>"


def test_chat_template_ids_of_a_two_turn_conversation():
    tok = build_tiny_tokenizer(corpus=["Go"])
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": "P_G"},
    ]
    closed = [
        "<|im_start|>",
        "user",
        "\n",
        "Go",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "assistant",
        "\n",
        "<answer>",
        "Up",
        "</answer>",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "user",
        "\n",
        "P",
        "_",
        "G",
        "<|im_end|>",
        "\n",
    ]
    prompt = chat_template_ids(tok, messages, add_generation_prompt=True)
    assert type(prompt) is list and all(type(i) is int for i in prompt)
    assert tok.convert_ids_to_tokens(prompt) == closed + ["<|im_start|>", "assistant", "\n"]
    assert tok.convert_ids_to_tokens(chat_template_ids(tok, messages, False)) == closed


def test_frozen_lake_corpus_has_no_unknown_words_and_a_small_vocab(lake_corpus):
    tok = build_tiny_tokenizer(lake_corpus)
    assert len(tok) < 100
    assert all(tok.unk_token_id not in tok(text)["input_ids"] for text in lake_corpus)
    assert {"Left", "Down", "Right", "Up", "You", "hole"} <= set(tok.get_vocab())


def test_build_loads_offline_with_auto_classes(tiny_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tok)
    assert (model.config.pad_token_id, model.config.eos_token_id) == (0, 3)
    assert model.generation_config.eos_token_id == 3
    assert tok.model_max_length == 2048
    assert tok.convert_ids_to_tokens(tok("You are on ice.")["input_ids"]) == [
        "You",
        "are",
        "on",
        "ice",
        ".",
    ]
    assert sum(p.numel() for p in model.parameters()) == 128 * len(tok) + BODY_PARAMS


def test_qwen2_arch_adds_only_the_qkv_biases(tmp_path):
    path = build_tiny_model(tmp_path / "qwen", arch="qwen2")
    model = load_causal_lm(path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    vocab = len(load_tokenizer(path))
    assert sum(p.numel() for p in model.parameters()) == 128 * vocab + BODY_PARAMS + 2 * 3 * 128


def test_same_seed_same_weights_other_seed_other_weights(tiny_dir, tmp_path):
    again = load_file(f"{build_tiny_model(tmp_path / 'a', corpus=['You are on ice.'])}/model.safetensors")
    other = load_file(f"{build_tiny_model(tmp_path / 'b', corpus=['You are on ice.'], seed=1)}/model.safetensors")
    first = load_file(f"{tiny_dir}/model.safetensors")
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["model.layers.0.mlp.up_proj.weight"], other["model.layers.0.mlp.up_proj.weight"])


def test_build_is_idempotent_and_overwrite_swaps_the_dir(tmp_path):
    path = build_tiny_model(tmp_path / "m", seed=0)
    weights = load_file(f"{path}/model.safetensors")
    assert build_tiny_model(tmp_path / "m", seed=1) == path  # exists: returned unchanged
    assert all(torch.equal(v, weights[k]) for k, v in load_file(f"{path}/model.safetensors").items())
    build_tiny_model(tmp_path / "m", seed=1, overwrite=True)
    rebuilt = load_file(f"{path}/model.safetensors")
    assert not torch.equal(rebuilt["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no tmp or old dirs left


def test_killed_build_leaves_no_output_dir(tmp_path, monkeypatch):
    def fail(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(build_tiny_tokenizer()), "save_pretrained", fail)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_model(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_non_model_dir_is_neither_overwritten_nor_loaded(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="has no config.json"):
        build_tiny_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_causal_lm(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_tokenizer(tmp_path / "missing")


def test_value_model_reuses_the_body_and_seeds_its_head(tiny_dir, tmp_path):
    policy = load_causal_lm(tiny_dir)
    critic = load_value_model(tiny_dir, seed=5)
    assert torch.equal(critic.model.layers[1].mlp.up_proj.weight, policy.model.layers[1].mlp.up_proj.weight)
    assert critic.dropout.p == 0.0
    values = critic(input_ids=torch.tensor([[2, 7, 6], [2, 8, 6]])).logits
    assert values.shape == (2, 3, 1)
    assert torch.equal(load_value_model(tiny_dir, seed=5).score.weight, critic.score.weight)
    assert not torch.equal(load_value_model(tiny_dir, seed=6).score.weight, critic.score.weight)
    critic.save_pretrained(tmp_path / "critic")  # a checkpoint keeps its trained head
    reloaded = load_value_model(tmp_path / "critic", seed=6)
    assert torch.equal(reloaded.score.weight, critic.score.weight)


def test_cli_preset_builds_the_frozen_lake_model(tmp_path, lake_corpus, capsys):
    path = main(
        [
            "--output_dir",
            str(tmp_path / "lake"),
            "--preset",
            "frozen_lake",
            "--hidden_size",
            "64",
            "--num_attention_heads",
            "2",
        ]
    )
    assert capsys.readouterr().out.strip() == path
    config = json.loads((tmp_path / "lake" / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]) == (
        64,
        2,
        2,
    )
    assert config["vocab_size"] == len(build_tiny_tokenizer(lake_corpus))


def test_cli_unknown_env_type_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown env_type 'no_such_env'"):
        main(["--output_dir", str(tmp_path / "m"), "--env_type", "no_such_env"])
    assert list(tmp_path.iterdir()) == []
