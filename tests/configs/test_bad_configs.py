"""Bad-input sweep (issue 6): every malformed config makes the CLI exit 2 with exactly one stderr
line, "config error: KEY: why", naming the offending key, and nothing heavy (the pipeline, hence
Ray and the models) is started first.

Most cases run `roll.cli.main` in-process (fast); three run the real script in a subprocess to
prove the exit status and the single stderr line end to end. An expected line ending in "..." is
compared as a prefix (the rest lists registered envs, which other packages may extend).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from roll.cli import main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "examples", "start_agentic_pipeline.py")
CONFIG_DIR = os.path.join(REPO_ROOT, "tests", "configs")
CONFIG_NAME = "minimal_agentic"
FROZEN_LAKE = "envs.frozen_lake.env:FrozenLakeEnv"
FROZEN_LAKE_ARGS = (
    "size, hole_prob, is_slippery, max_path_length, format_penalty, render_mode, action_pattern, env_instruction, "
    "max_steps, show_neighbours, detour_prob"
)
BOTH_TAGS = "['SimpleFrozenLake', 'LargeFrozenLake']"
UNKNOWN_ENV_CONFIG_KEY = (
    f"custom_envs.SimpleFrozenLake.env_config.sizee: unknown env_config key(s) 'sizee' for "
    f"env_type '{FROZEN_LAKE}' (FrozenLakeEnv); accepted: {FROZEN_LAKE_ARGS}"
)
STEP_WISE = ["train_env_manager.env_manager_type=step", "adv_estimator=gigpo",
             "+reference.strategy_args.strategy_name=torch"]  # fmt: skip


def at_least(n: int, got: object) -> str:
    return f"input should be greater than or equal to {n} (got {got})"


# (overrides of minimal_agentic.yaml, the stderr line after "config error: ")
BAD_OVERRIDES = [
    # unknown keys, at every depth
    (["+rollout_batchsize=8"], "rollout_batchsize: unknown key (did you mean 'rollout_batch_size'?)"),
    (
        ["actor_train.training_args.lerning_rate=0.1"],
        "actor_train.training_args.lerning_rate: unknown key (did you mean 'learning_rate'?)",
    ),
    (["+train_env_manager.group_sizes=2"], "train_env_manager.group_sizes: unknown key (did you mean 'group_size'?)"),
    (["custom_envs.SimpleFrozenLake.env_config.sizee=4"], UNKNOWN_ENV_CONFIG_KEY),
    (
        ["+custom_envs.LargeFrozenLake.env_config.fault_injection.raise_pp=0.1"],
        "custom_envs.LargeFrozenLake.env_config.fault_injection.raise_pp: extra inputs are not permitted",
    ),
    (
        ["+custom_envs.LargeFrozenLake.env_config.fault_injection.raise_p=2"],
        ("custom_envs.LargeFrozenLake.env_config.fault_injection.raise_p: input should be less than or equal to 1"),
    ),
    (
        ["+custom_envs.LargeFrozenLake.env_config.fault_injection={raise_p:0.6,hang_p:0.6}"],
        "custom_envs.LargeFrozenLake.env_config.fault_injection: raise_p + hang_p + garbage_p must be <= 1",
    ),
    # wrong types
    (
        ["ppo_epochs=two"],
        "ppo_epochs: input should be a valid integer, unable to parse string as an integer (got 'two')",
    ),
    (["gamma=[0.9]"], "gamma: input should be a valid number (got [0.9])"),
    (["max_steps=true"], "max_steps: expected a number, not a boolean (got true)"),
    (
        ["actor_train.training_args.learning_rate=false"],
        "actor_train.training_args.learning_rate: expected a number, not a boolean (got false)",
    ),
    (["exp_name={a:1}"], "exp_name: input should be a valid string (got {'a': 1})"),
    (
        ["sequence_length=1.5"],
        "sequence_length: input should be a valid integer, got a number with a fractional part (got 1.5)",
    ),
    (
        ["train_env_manager.tags=SimpleFrozenLake"],
        "train_env_manager.tags: input should be a valid list (got 'SimpleFrozenLake')",
    ),
    (
        ["custom_envs.SimpleFrozenLake=5"],
        ("custom_envs.SimpleFrozenLake: input should be a valid dictionary or instance of CustomEnvConfig (got 5)"),
    ),
    (["pg_clip=inf"], "pg_clip: input should be a finite number (got inf)"),
    (["episode_reward_weight=nan"], "episode_reward_weight: input should be a finite number (got nan)"),
    # sizes and counts that must be positive (or non-negative)
    (["rollout_batch_size=0"], "rollout_batch_size: " + at_least(1, 0)),
    (["val_batch_size=-2"], "val_batch_size: " + at_least(0, -2)),
    (["train_env_manager.group_size=0"], "train_env_manager.group_size: " + at_least(1, 0)),
    (["val_env_manager.num_env_groups=0"], "val_env_manager.num_env_groups: " + at_least(1, 0)),
    (["max_steps=-1"], "max_steps: " + at_least(1, -1)),
    (["custom_envs.SimpleFrozenLake.max_steps=0"], "custom_envs.SimpleFrozenLake.max_steps: " + at_least(1, 0)),
    (
        ["custom_envs.SimpleFrozenLake.max_tokens_per_step=-8"],
        "custom_envs.SimpleFrozenLake.max_tokens_per_step: " + at_least(1, -8),
    ),
    (["sequence_length=0"], "sequence_length: " + at_least(1, 0)),
    (["ppo_epochs=0"], "ppo_epochs: " + at_least(1, 0)),
    (
        ["actor_train.training_args.per_device_train_batch_size=0"],
        "actor_train.training_args.per_device_train_batch_size: " + at_least(1, 0),
    ),
    (
        ["actor_train.training_args.gradient_accumulation_steps=-1"],
        "actor_train.training_args.gradient_accumulation_steps: " + at_least(1, -1),
    ),
    (["actor_infer.generating_args.max_new_tokens=0"], "actor_infer.generating_args.max_new_tokens: " + at_least(1, 0)),
    (["eval_steps=-1"], "eval_steps: " + at_least(0, -1)),
    (["save_steps=-5"], "save_steps: " + at_least(0, -5)),
    # rates and coefficients out of range
    (
        ["actor_train.training_args.learning_rate=0"],
        "actor_train.training_args.learning_rate: input should be greater than 0 (got 0)",
    ),
    (["actor_infer.generating_args.temperature=-0.5"], "actor_infer.generating_args.temperature: " + at_least(0, -0.5)),
    (
        ["actor_infer.generating_args.top_p=1.5"],
        "actor_infer.generating_args.top_p: input should be less than or equal to 1 (got 1.5)",
    ),
    (["pg_clip=0"], "pg_clip: input should be greater than 0 (got 0)"),
    (["async_generation_ratio=-1"], f"async_generation_ratio: {at_least(0, -1)}"),
    (["off_policy_correction.cap=0"], "off_policy_correction.cap: input should be greater than 0 (got 0)"),
    (["train_env_manager.group_size_redundancy=-1"], f"train_env_manager.group_size_redundancy: {at_least(0, -1)}"),
    (
        ["train_env_manager.generate_timeout_s=0"],
        "train_env_manager.generate_timeout_s: input should be greater than 0 (got 0)",
    ),
    (
        ["off_policy_correction.level=row"],
        "off_policy_correction.level: input should be 'token' or 'sequence' (got 'row')",
    ),
    (["gamma=1.5"], "gamma: input should be less than or equal to 1 (got 1.5)"),
    (["lambd=-0.1"], "lambd: " + at_least(0, -0.1)),
    (["rollout_filter_ratio=0"], "rollout_filter_ratio: input should be greater than 0 (got 0)"),
    # batch arithmetic and env-manager structure
    (["train_env_manager.group_size=3"], "rollout_batch_size: 8 is not a multiple of train_env_manager.group_size=3"),
    (["val_env_manager.group_size=3"], "val_batch_size: 8 is not a multiple of val_env_manager.group_size=3"),
    (
        ["val_env_manager.num_groups_partition=[2,1]"],
        "val_env_manager.num_groups_partition: [2, 1] must be non-negative and sum to num_env_groups=4",
    ),
    (
        ["val_env_manager.num_groups_partition=[1,1,2]"],
        f"val_env_manager.num_groups_partition: needs one number per tag {BOTH_TAGS}, got [1, 1, 2]",
    ),
    (
        ["train_env_manager.tags=[]"],
        "train_env_manager.tags: list should have at least 1 item after validation, not 0 (got [])",
    ),
    (
        ["val_env_manager.tags=[LargeFrozenLake,LargeFrozenLake]"],
        "val_env_manager.tags: must be distinct (got ['LargeFrozenLake', 'LargeFrozenLake'])",
    ),
    (
        ["val_env_manager.tags=[SimpleFrozenLake,HugeFrozenLake]"],
        ("val_env_manager.tags: 'HugeFrozenLake' is not in custom_envs ['LargeFrozenLake', 'SimpleFrozenLake']"),
    ),
    (
        ["+train_env_manager.env_manager_type=stepwise"],
        "train_env_manager.env_manager_type: input should be 'traj' or 'step' (got 'stepwise')",
    ),
    # names that must be one of a known set
    (
        ["custom_envs.LargeFrozenLake.env_type=frozen_lakes"],
        "custom_envs.LargeFrozenLake.env_type: unknown env_type 'frozen_lakes'; known: ...",
    ),
    (
        ["custom_envs.LargeFrozenLake.env_type=.frozen_lake:FrozenLakeEnv"],
        (
            "custom_envs.LargeFrozenLake.env_type: '.frozen_lake:FrozenLakeEnv' is not of the form "
            "'package.module:ClassName' (or give a registered id or alias, without ':')"
        ),
    ),
    (
        ["custom_envs.LargeFrozenLake.env_type=os:getcwd"],
        (
            "custom_envs.LargeFrozenLake.env_type: env_type 'os:getcwd' names <built-in function getcwd>, "
            "which is not a TextEnv subclass"
        ),
    ),
    (
        ["actor_train.strategy_args.strategy_name=fsdp"],
        (
            "actor_train.strategy_args.strategy_name: 'fsdp' is not a known strategy; "
            "available for actor_train: torch, deepspeed, fsdp2, megatron"
        ),
    ),
    (
        ["adv_estimator=ppo"],
        ("adv_estimator: input should be 'gae', 'grpo', 'reinforce', 'gigpo' or 'step_reinforce' (got 'ppo')"),
    ),
    (
        ["loss_agg_mode=sum"],
        ("loss_agg_mode: input should be 'token-mean', 'seq-mean-token-mean' or 'seq-mean-token-sum' (got 'sum')"),
    ),
    (
        ["+actor_train.pg_variant=grpo"],
        ("actor_train.pg_variant: input should be 'vanilla', 'ppo', 'tis', 'topr', 'cispo' or 'kimi15' (got 'grpo')"),
    ),
    (["+actor_infer.pg_variant=topr"], "actor_infer.pg_variant: only actor_train has a policy-gradient loss"),
    (["+actor_train.tis_lower_bound=2.0"], "actor_train.tis_lower_bound: 2.0 is above tis_upper_bound 1.0"),
    (
        ["actor_train.training_args.lr_scheduler_type=exponential"],
        (
            "actor_train.training_args.lr_scheduler_type: input should be 'constant', 'linear' or 'cosine' "
            "(got 'exponential')"
        ),
    ),
    # greedy training groups would be flat under a group-relative estimator; validation may be greedy
    (
        ["actor_infer.generating_args.temperature=0"],
        (
            "actor_infer.generating_args.temperature: 0.0 makes the training rollouts greedy: the members of "
            "each grpo group would play alike and their advantages would all be 0 (nothing learnt); sample for "
            "training (do_sample: true, temperature > 0) and make only val_env_manager greedy"
        ),
    ),
    (
        [*STEP_WISE, "+train_env_manager.generating_args.do_sample=false"],
        (
            "train_env_manager.generating_args.do_sample: false makes the training rollouts greedy: the members "
            "of each gigpo group would play alike and their advantages would all be 0 (nothing learnt); sample "
            "for training (do_sample: true, temperature > 0) and make only val_env_manager greedy"
        ),
    ),
    (
        ["+actor_train.model_args.lora_rank=4", "+actor_train.model_args.lora_target=''"],
        "actor_train.model_args.lora_target: '' names an empty module; write all-linear, or module names "
        "separated by commas",
    ),
    (
        ["+actor_train.model_args.lora_rank=4", "+actor_train.model_args.lora_target='q_proj,,v_proj'"],
        "actor_train.model_args.lora_target: 'q_proj,,v_proj' names an empty module; write all-linear, or "
        "module names separated by commas",
    ),
    (
        ["+actor_train.model_args.attn_implementation=bogus"],
        'actor_train.model_args.attn_implementation: Specified `attn_implementation="bogus"` is not supported. '
        'The only possible arguments are `attn_implementation="eager"`...',
    ),
    (
        ["+actor_infer.generating_args.stop_strings=[ab cd]"],
        "actor_infer.generating_args.stop_strings: 'ab cd' is not a single token...",
    ),
    # features that are not there (yet), and paths that must exist
    (
        [*STEP_WISE, "init_kl_coef=0.1"],
        "init_kl_coef: the KL penalty is not available for step-wise samples yet; use 0",
    ),
    ([*STEP_WISE, "target_kl=0.05"], "target_kl: the KL penalty is not available for step-wise samples yet; use null"),
    (
        ["resume_from_checkpoint=/no/such/checkpoint"],
        (
            "resume_from_checkpoint: expected true, false or an existing checkpoint directory "
            "(got '/no/such/checkpoint')"
        ),
    ),
    (
        ["pretrain=/no/such/model"],
        (
            "pretrain: '/no/such/model' is not a local model directory (no config.json); build the tiny "
            "model with `python -m roll.pipeline.tiny_model --output_dir DIR` and point to DIR"
        ),
    ),
    # overrides hydra cannot apply
    (["=3"], "=3: bad override syntax: no key (expected KEY=VALUE)"),
    (
        ["~rollout_filter_ratio"],
        "rollout_filter_ratio: Could not delete from config. 'rollout_filter_ratio' does not exist.",
    ),
    (["+max_steps=4"], "max_steps: Could not append to config. An item is already at 'max_steps'."),
]


def without_train_env_manager(data: dict) -> None:
    del data["train_env_manager"]


def train_env_manager_as_list(data: dict) -> None:
    data["train_env_manager"] = [1, 2]


def custom_envs_as_list(data: dict) -> None:
    data["custom_envs"] = ["SimpleFrozenLake"]


# (change to minimal_agentic.yaml, the stderr line after "config error: ")
BAD_STRUCTURES = [
    (without_train_env_manager, "train_env_manager: required key is missing"),
    (
        train_env_manager_as_list,
        ("train_env_manager: input should be a valid dictionary or instance of EnvManagerConfig (got [1, 2])"),
    ),
    (custom_envs_as_list, "custom_envs: input should be a valid dictionary (got ['SimpleFrozenLake'])"),
]


@pytest.fixture(autouse=True)
def no_pipeline(monkeypatch):
    """Importing the pipeline module fails, so a config that got past validation would fail the
    test: config errors must be reported before the pipeline (Ray, models) is touched."""
    monkeypatch.setitem(sys.modules, "roll.pipeline.agentic_pipeline", None)


def run_cli(capsys, config_dir: str, config_name: str, *overrides: str) -> tuple[int, list[str]]:
    status = main(["--config_path", config_dir, "--config_name", config_name, *overrides])
    out, err = capsys.readouterr()
    assert out == ""
    return status, err.splitlines()


def assert_one_line(status: int, lines: list[str], expected: str) -> None:
    assert status == 2
    assert len(lines) == 1, lines
    if expected.endswith("..."):
        assert lines[0].startswith("config error: " + expected[:-3])
    else:
        assert lines[0] == "config error: " + expected


@pytest.mark.parametrize(("overrides", "expected"), BAD_OVERRIDES, ids=[" ".join(o) for o, _ in BAD_OVERRIDES])
def test_bad_override_exits_2_with_one_line_naming_the_key(capsys, model_dir, overrides, expected):
    status, lines = run_cli(capsys, CONFIG_DIR, CONFIG_NAME, f"pretrain={model_dir}", *overrides)
    assert_one_line(status, lines, expected)


def test_the_sweep_is_at_least_35_distinct_configs():
    assert len({tuple(overrides) for overrides, _ in BAD_OVERRIDES}) == len(BAD_OVERRIDES) >= 35


@pytest.mark.parametrize(("change", "expected"), BAD_STRUCTURES, ids=[change.__name__ for change, _ in BAD_STRUCTURES])
def test_bad_yaml_structure_exits_2_with_one_line(capsys, tmp_path, model_dir, change, expected):
    with open(os.path.join(CONFIG_DIR, f"{CONFIG_NAME}.yaml")) as f:
        data = yaml.safe_load(f)
    change(data)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    status, lines = run_cli(capsys, str(tmp_path), "bad", f"pretrain={model_dir}")
    assert_one_line(status, lines, expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_steps: [1\n", "{yaml} line 2: invalid YAML: ..."),
        ("max_steps: 1\nmax_steps: 2\n", "{yaml} line 2: invalid YAML: found duplicate key max_steps"),
        ("- max_steps\n- 3\n", "config_name: 'bad' must be a mapping of keys to values"),
        ("max_steps: 3\npretrain: ???\n", "pretrain: required value is missing (it is ??? in the YAML)"),
    ],
    ids=["syntax error", "duplicate key", "top-level list", "missing pretrain"],
)
def test_unreadable_yaml_exits_2_with_one_line(capsys, tmp_path, text, expected):
    (tmp_path / "bad.yaml").write_text(text)
    status, lines = run_cli(capsys, str(tmp_path), "bad")
    assert_one_line(status, lines, expected.format(yaml=tmp_path / "bad.yaml"))


def test_missing_config_name_exits_2_with_one_line(capsys):
    status, lines = run_cli(capsys, CONFIG_DIR, "no_such_config")
    assert_one_line(status, lines, f"config_name: no 'no_such_config' config in {CONFIG_DIR}")


def test_a_valid_config_would_reach_the_pipeline(model_dir):
    # The guard of `no_pipeline` is live: without a config error, main goes on to the pipeline.
    with pytest.raises(ImportError, match="roll.pipeline.agentic_pipeline"):
        main(["--config_path", CONFIG_DIR, "--config_name", CONFIG_NAME, f"pretrain={model_dir}"])


@pytest.mark.parametrize(
    ("config", "overrides", "expected"),
    [
        ("minimal", ["+rollout_batchsize=8"], "rollout_batchsize: unknown key (did you mean 'rollout_batch_size'?)"),
        ("minimal", ["custom_envs.SimpleFrozenLake.env_config.sizee=4"], UNKNOWN_ENV_CONFIG_KEY),
        ("broken", [], "{yaml} line 2: invalid YAML: ..."),
    ],
    ids=["unknown top-level key", "unknown env_config key", "YAML syntax error"],
)
def test_script_exits_2_with_one_stderr_line(tmp_path, model_dir, config, overrides, expected):
    (tmp_path / "broken.yaml").write_text("max_steps: [1\n")
    config_dir, name = (CONFIG_DIR, CONFIG_NAME) if config == "minimal" else (tmp_path, "broken")
    result = subprocess.run(
        [sys.executable, SCRIPT, "--config_path", str(config_dir), "--config_name", name,
         f"pretrain={model_dir}", *overrides],
        check=False, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.stdout == ""
    assert_one_line(result.returncode, result.stderr.splitlines(), expected.format(yaml=tmp_path / "broken.yaml"))
