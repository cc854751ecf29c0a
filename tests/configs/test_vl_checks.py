"""Vision-language configs through the CLI (roll/pipeline/checks/vision.py): ROLL's own
qwen2.5-vl-3B-agentic/agentic_val_sokoban.yaml passes every pre-start check on the tiny VL model
(`+profile=cpu_smoke` trains it with torch, not megatron), and each bad VL setup is one line
naming the key and exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from roll.cli import main
from roll.pipeline.tiny_model import main as build_model

ROLL_VL = Path(__file__).resolve().parents[2] / ".." / "shared" / "roll_examples" / "qwen2.5-vl-3B-agentic"
pytestmark = pytest.mark.skipif(not ROLL_VL.is_dir(), reason=f"ROLL's example configs are not at {ROLL_VL}")
LIMIT = "actor_infer.strategy_args.strategy_config.limit_mm_per_prompt.image"


@pytest.fixture(autouse=True)
def no_pipeline(monkeypatch):
    monkeypatch.setitem(sys.modules, "roll.pipeline.agentic_pipeline", None)


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return build_model(["--preset", "vl_sokoban", "--output_dir", str(tmp_path_factory.mktemp("m") / "vl")])


def run(capsys, tmp_path, model, *overrides, keep_notes=False):
    """(exit status, stderr lines); a run that passes every check reaches the (blocked) pipeline."""
    capsys.readouterr()  # not what a fixture wrote (a model build's progress bars)
    try:
        status = main(
            [
                "--config_path",
                str(ROLL_VL),
                "--config_name",
                "agentic_val_sokoban",
                "+profile=cpu_smoke",
                f"pretrain={model}",
                f"reward_pretrain={model}",
                f"output_dir={tmp_path}/out",
                f"logging_dir={tmp_path}/logs",
                f"render_save_dir={tmp_path}/render",
                f"++tracker_kwargs.log_dir={tmp_path}/tb",
                f"++checkpoint_config.output_dir={tmp_path}/ckpt",
                *overrides,
            ]
        )
    except ImportError as err:
        assert "roll.pipeline.agentic_pipeline" in str(err)
        status = "started"
    lines = capsys.readouterr().err.splitlines()
    if keep_notes:
        return status, lines
    return status, [line for line in lines if not line.startswith("profile cpu_smoke: ")]  # the profile's notes


def test_rolls_vl_sokoban_config_passes_every_check(capsys, tmp_path, vl_dir):
    status, notes = run(capsys, tmp_path, vl_dir, keep_notes=True)
    assert status == "started"
    assert "profile cpu_smoke: actor_train.strategy_args.strategy_name megatron_train -> torch_train" in "\n".join(
        notes
    )


def test_megatron_cannot_train_a_vl_model(capsys, tmp_path, vl_dir):
    megatron = "actor_train.strategy_args={strategy_name:megatron_train,strategy_config:null}"  # as the user asks
    status, lines = run(capsys, tmp_path, vl_dir, megatron)
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith("config error: actor_train.strategy_args.strategy_name: megatron runs its own GPT")


def test_a_text_only_model_is_refused(capsys, tmp_path, tmp_path_factory):
    from roll.models.tiny import build_tiny_model

    text_only = build_tiny_model(tmp_path_factory.mktemp("lm") / "lm", corpus=["You are P."])
    status, lines = run(capsys, tmp_path, text_only)
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith(f"config error: pretrain: {text_only} is a text-only model")


def test_an_env_without_images_is_refused(capsys, tmp_path, vl_dir):
    status, lines = run(capsys, tmp_path, vl_dir, "~custom_env.SimpleSokoban.env_config.render_mode")
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith("config error: custom_envs.SimpleSokoban.env_config.render_mode: the VL env manager")


def test_more_images_than_the_limit_is_refused(capsys, tmp_path, vl_dir):
    status, lines = run(capsys, tmp_path, vl_dir, f"{LIMIT}=2")
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith(f"config error: {LIMIT}: 2 is below custom_envs.SimpleSokoban.max_steps=")


STEP_WISE = [
    "++train_env_manager.env_manager_type=step",
    "++val_env_manager.env_manager_type=step",
    "adv_estimator=gigpo",
]


def test_rolls_vl_manager_plays_step_wise_when_its_managers_do(capsys, tmp_path, vl_dir):
    """ROLL has no step-wise VL manager: its VLTrajEnvManager takes the sample mode of the managers
    (step-wise: roll's VLStepEnvManager), whose prompts hold history_length + 1 images, not max_steps."""
    from roll.configs import load_config
    from roll.pipeline.setup.rollout_builders import env_spec

    status, lines = run(capsys, tmp_path, vl_dir, *STEP_WISE, f"{LIMIT}=1")
    assert status == "started", lines
    overrides = ["+profile=cpu_smoke", f"pretrain={vl_dir}", f"reward_pretrain={vl_dir}", *STEP_WISE]
    cfg = load_config(str(ROLL_VL), "agentic_val_sokoban", overrides)
    assert cfg.train_env_manager.env_manager_type == "step" and env_spec(cfg, "SimpleSokoban").vision
    status, lines = run(capsys, tmp_path, vl_dir, *STEP_WISE, f"{LIMIT}=1", "++train_env_manager.history_length=1")
    assert status == 2 and lines == [
        f"config error: {LIMIT}: 1 is below 2: a SimpleSokoban step's prompt carries the frames of its last 1 "
        "steps (history_length) and its own"
    ]


def test_an_engine_without_image_requests_is_refused(tmp_path, vl_dir, monkeypatch):
    """vllm and sglang (not installed here) are named by validation first; where they are, this
    check names them with the reason: sglang always, vllm where torchvision does not import."""
    from roll.configs import ConfigError, load_config
    from roll.pipeline.checks import vision

    cfg = load_config(
        str(ROLL_VL), "agentic_val_sokoban", ["+profile=cpu_smoke", f"pretrain={vl_dir}", f"reward_pretrain={vl_dir}"]
    )
    vision.check_vision(cfg)
    cfg.actor_infer.strategy_args.strategy_name = "vllm"
    no_torchvision = "ModuleNotFoundError: No module named 'torchvision'"
    monkeypatch.setattr(vision, "torchvision_import_error", lambda: no_torchvision)
    with pytest.raises(ConfigError) as vllm:
        vision.check_vision(cfg)
    assert str(vllm.value) == (
        "actor_infer.strategy_args.strategy_name: 'vllm' cannot take image requests here: torchvision does not "
        f"import ({no_torchvision}); {vision.VLLM_NEEDS_TORCHVISION}; use hf (hf_infer) with the VL env manager"
    )
    assert "\n" not in str(vllm.value) and "install_vllm_cpu.sh --images" in str(vllm.value)
    monkeypatch.setattr(vision, "torchvision_import_error", lambda: None)
    vision.check_vision(cfg)  # torchvision imports: vllm takes the images
    cfg.actor_infer.strategy_args.strategy_name = "sglang"
    with pytest.raises(ConfigError, match=r"'sglang' does not take image requests here yet \(its strategy sends token"):
        vision.check_vision(cfg)


def test_whether_torchvision_imports_is_this_pythons_answer():
    """The check asks a child interpreter; its answer is an import in this one's."""
    import importlib

    from roll.pipeline.checks.vision import torchvision_import_error

    try:
        importlib.import_module("torchvision")
    except Exception as err:
        error = torchvision_import_error()
        assert error is not None and str(err).splitlines()[-1] in error
    else:
        assert torchvision_import_error() is None


def test_a_sequence_length_below_the_first_vl_prompt_is_refused(capsys, tmp_path, vl_dir):
    status, lines = run(capsys, tmp_path, vl_dir, "sequence_length=70")
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith("config error: sequence_length: 70 cannot hold SimpleSokoban's first prompt (")
    assert "its image included" in lines[0]


def test_partial_rollout_is_refused_with_the_vl_managers(capsys, tmp_path, vl_dir):
    """Image requests are generated a call at a time: no token boundary to stop them at."""
    status, notes = run(capsys, tmp_path, vl_dir, "+partial_rollout=true", "async_generation_ratio=1")
    assert status == 2
    assert notes == [
        "config error: partial_rollout: the hf engine generates image requests a call at a time, which a weight "
        "sync cannot stop at a token boundary; use false with the VL env managers"
    ]
