"""The WebShop example config validates, and its env settings fit its sequence length."""

from pathlib import Path

from envs.webshop.env import WebShopEnv
from roll.agentic.env.registry import make_env
from roll.configs import load_config
from roll.models.tiny import build_tiny_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "webshop"


def test_example_config_loads_and_builds_its_env(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = load_config(str(EXAMPLES), "agent_val_webshop", [f"pretrain={tmp_path}"])
    assert (cfg.adv_estimator, cfg.train_env_manager.env_manager_type) == ("grpo", "traj")
    spec = cfg.custom_envs["WebShop"]
    assert spec.instruction is None  # the goal is in the env's instruction: keep it
    env = make_env(spec.env_type, spec.env_config)
    assert isinstance(env, WebShopEnv) and env.results_per_page == 5
    # the scripted expert's longest episode of 20 fits the sequence length with room to spare
    tokenizer = build_tiny_tokenizer(env.tokenizer_corpus())
    longest = 0
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        tokens = len(tokenizer(info["env_instruction"] + obs)["input_ids"])
        while (action := env.scripted_action()) is not None:
            obs = env.step(action)[0]
            tokens += len(tokenizer(action + obs)["input_ids"])
        longest = max(longest, tokens)
    env.close()
    assert longest < cfg.sequence_length // 2
