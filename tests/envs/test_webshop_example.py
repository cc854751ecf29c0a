"""The WebShop example config validates, and its env settings fit its sequence length."""

from pathlib import Path

import yaml

from envs.webshop.env import WebShopEnv
from roll.agentic.env.registry import make_env
from roll.configs import load_config
from roll.models.tiny import build_tiny_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "webshop"


def test_example_config_loads_and_builds_its_env(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = load_config(str(EXAMPLES), "agent_val_webshop", [f"pretrain={tmp_path}"])
    assert (cfg.adv_estimator, cfg.train_env_manager.env_manager_type) == ("gigpo", "step")
    assert cfg.train_env_manager.history_length == 0  # a prompt holds one page: its codes to copy
    raw = yaml.safe_load((EXAMPLES / "agent_val_webshop.yaml").read_text())
    assert raw["pretrain"] == "./output/models/tiny-webshop-warm"  # warm-started (run_*.sh builds it)
    spec = cfg.custom_envs["WebShop"]
    assert spec.instruction is None  # the goal is in the env's instruction: keep it
    env = make_env(spec.env_type, spec.env_config)
    assert isinstance(env, WebShopEnv) and env.results_per_page == 5
    # every step's prompt (the instruction and one page) and answer of the scripted expert's
    # episodes fit the sequence length with room to spare
    tokenizer = build_tiny_tokenizer(env.tokenizer_corpus(), env.tokenizer_whole_words())
    longest = 0
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        while (action := env.scripted_action()) is not None:
            longest = max(longest, len(tokenizer(info["env_instruction"] + obs + action)["input_ids"]))
            obs = env.step(action)[0]
    env.close()
    assert 100 < longest < cfg.sequence_length // 2
