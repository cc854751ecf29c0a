"""The Qwen2-layout stand-in: Qwen2.5-Instruct's files and kinds of tokenizer, config and weights,
loadable by transformers and by roll's loaders, the same for the same seed."""

import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll.models.chat_template import chat_template_ids, continuation_ids
from roll.models.loading import load_tokenizer
from roll.models.qwen2_layout import ENDOFTEXT, IM_END, IM_START, build_qwen2_layout_model, main


def test_the_directory_has_qwen2_instructs_files_and_kinds(tmp_path):
    path = tmp_path / "m"
    assert main(["--output_dir", str(path)]) == str(path.resolve())
    names = {p.name for p in path.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["tie_word_embeddings"]) == (
        "qwen2",
        ["Qwen2ForCausalLM"],
        True,
    )
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped KV heads, as Qwen2's
    assert {t.dtype for t in load_file(path / "model.safetensors").values()} == {torch.bfloat16}

    tokenizer = AutoTokenizer.from_pretrained(path)
    assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == (IM_END, ENDOFTEXT, None)
    assert config["vocab_size"] > len(tokenizer) and config["vocab_size"] % 128 == 0  # padded rows, as Qwen's
    assert json.loads((path / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])


def test_any_text_round_trips_and_the_chat_template_is_qwens(tmp_path):
    path = build_qwen2_layout_model(tmp_path / "m")
    tokenizer = load_tokenizer(path)
    text = "Grid:\nP_OG\n__O_\n héllo 42 <answer>Left</answer>"  # words the BPE never saw still encode (bytes)
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        f"{IM_START}system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.{IM_END}\n"
        f"{IM_START}user\nhi{IM_END}\n{IM_START}assistant\n"
    )
    ids = chat_template_ids(tokenizer, [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], True)
    assert ids[0] == tokenizer.convert_tokens_to_ids(IM_START)
    after = continuation_ids(tokenizer, [{"role": "user", "content": "next"}])  # multi-turn bookkeeping works
    assert after[0] == tokenizer.convert_tokens_to_ids(IM_END)


def test_the_same_seed_builds_the_same_model_and_it_loads(tmp_path):
    a = build_qwen2_layout_model(tmp_path / "a", seed=3)
    b = build_qwen2_layout_model(tmp_path / "b", seed=3)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    wa, wb = load_file(f"{a}/model.safetensors"), load_file(f"{b}/model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    model = AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32)
    assert (
        model.config.model_type == "qwen2"
        and model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size
    )
