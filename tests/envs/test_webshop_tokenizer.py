"""WebShop's tokenizer corpus covers every word the env shows or the scripted agent writes."""

from envs.webshop.env import WebShopEnv
from roll.models.tiny import build_tiny_tokenizer
from roll.pipeline.tiny_model import PRESETS, env_corpus


def test_corpus_covers_instructions_pages_and_actions():
    env = WebShopEnv()
    tokenizer = build_tiny_tokenizer(env.tokenizer_corpus())
    texts = []
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        texts += [info["env_instruction"], obs]
        while (action := env.scripted_action()) is not None:
            texts += [action, env.step(action)[0]]
    for page in ("Description", "Features"):  # the sub-pages the expert never opens
        env.reset(seed=0)
        env.step(env.scripted_action())
        env.step(env.scripted_action())
        texts.append(env.step(f"<answer>click[{page}]</answer>")[0])
    env.close()
    unknown = {
        piece
        for text in texts
        for piece in tokenizer.tokenize(text)
        if tokenizer.convert_tokens_to_ids(piece) == tokenizer.unk_token_id
    }
    assert unknown == set()
    assert len(tokenizer) < 1500  # word-level vocabulary of the shipped catalog


def test_tiny_preset_uses_the_corpus():
    assert PRESETS["webshop"] == ("webshop", {})
    assert env_corpus(*PRESETS["webshop"]) == WebShopEnv().tokenizer_corpus()


def test_the_tiny_preset_keeps_each_product_code_one_token(tmp_path):
    """A product click copies one token, not ten; the rest of the page still splits into words."""
    from transformers import AutoTokenizer

    from roll.pipeline.tiny_model import main as build

    env = WebShopEnv()
    asins = env.tokenizer_whole_words()
    assert len(asins) == len(env.catalog.products) == len(set(asins))
    env.close()
    tokenizer = AutoTokenizer.from_pretrained(build(["--preset", "webshop", "--output_dir", str(tmp_path / "m")]))
    click = f"click[{asins[7]}]</answer>"
    assert tokenizer.tokenize(click) == ["click", "[", asins[7], "]", "</answer>"]
    assert tokenizer.tokenize("size: 16 oz") == ["size", ":", "1", "6", "oz"]
    assert (
        tokenizer.decode(tokenizer.encode(f"[{asins[3]}] $12.99", add_special_tokens=False)).replace(" ", "")
        == f"[{asins[3]}]$12.99"
    )
