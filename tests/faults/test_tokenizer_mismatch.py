"""Fault: the engine's tokenizer and a trained role's model disagree (a model dir or checkpoint
built with another tokenizer). Before this check the run started, and either a trainer's embedding
was indexed past its end (a dead worker) or, with two vocabularies of one size, the trainer read
the engine's ids as other words and trained on them without a sign. Now the CLI refuses the config
before Ray starts, with one line naming the role's key and both paths, exit 2. Nothing ran, so
nothing is lost: give the roles one tokenizer and start again.

Real model dirs (the tiny builder with two corpora), through the CLI as a user meets it."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

from roll.cli import main
from roll.models.tiny import build_tiny_model
from tests.faults.timing import detected

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


@pytest.fixture(autouse=True)
def no_pipeline(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "roll.pipeline.agentic_pipeline", None)  # a config that passes: "started"
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three tiny model dirs: `base`, `same` (another model, the same tokenizer) and `wider` (a
    tokenizer with more words, and an embedding to match)."""
    root = tmp_path_factory.mktemp("models")
    corpus = ["You are P."]
    return {
        "base": build_tiny_model(root / "base", corpus=corpus, seed=0),
        "same": build_tiny_model(root / "same", corpus=corpus, seed=1),
        "wider": build_tiny_model(root / "wider", corpus=[*corpus, "Sokoban boxes walls targets"], seed=0),
    }


def run(capsys, *overrides):
    started = time.perf_counter()
    try:
        status = main(["--config_path", CONFIG_DIR, "--config_name", "minimal_agentic", *overrides])
    except ImportError as err:
        assert "roll.pipeline.agentic_pipeline" in str(err)
        status = "started"
    return status, capsys.readouterr().err.splitlines(), time.perf_counter() - started


def test_a_trainer_whose_tokenizer_differs_from_the_engines_is_refused_naming_both_paths(models, capsys):
    base, wider = models["base"], models["wider"]
    status, lines, seconds = run(capsys, f"pretrain={base}", f"actor_train.model_args.model_name_or_path={wider}")
    assert status == 2
    assert lines == [
        f"config error: actor_train.model_args.model_name_or_path: {wider}'s tokenizer differs from the "
        f"engine's ({base}): {_size(wider)} tokens against the engine's {_size(base)}"
    ]
    detected("tokenizer_mismatch", seconds)


def test_an_engine_tokenizer_wider_than_a_trainers_embedding_is_refused(models, capsys):
    base, wider = models["base"], models["wider"]
    status, lines, _ = run(capsys, f"pretrain={base}", f"actor_infer.model_args.model_name_or_path={wider}")
    assert (status, lines) == (
        2,
        [
            f"config error: actor_train.model_args.model_name_or_path: {base} embeds {_embedded(base)} tokens "
            f"(its config.json vocab_size) but the engine's tokenizer (actor_infer.model_args.model_name_or_path: "
            f"{wider}) has {_size(wider)}; give every role the tokenizer its model was trained with"
        ],
    )


def test_two_vocabularies_of_one_size_are_told_apart_by_the_first_id_they_disagree_on(models, tmp_path, capsys):
    swapped = tmp_path / "swapped"
    shutil.copytree(models["base"], swapped)
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["You"], vocab["are"] = vocab["are"], vocab["You"]  # the same words, two of them numbered the other way
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    status, lines, _ = run(capsys, f"pretrain={models['base']}", f"actor_train.model_args.model_name_or_path={swapped}")
    assert (status, lines) == (
        2,
        [
            f"config error: actor_train.model_args.model_name_or_path: {swapped}'s tokenizer differs from the "
            f"engine's ({models['base']}): id {vocab['are']} is 'are' here and 'You' to the engine"
        ],
    )


def test_roles_with_one_tokenizer_start(models, capsys):
    status, lines, _ = run(
        capsys, f"pretrain={models['base']}", f"actor_train.model_args.model_name_or_path={models['same']}"
    )
    assert status == "started", lines


def _size(path: str) -> int:
    from roll.models.loading import load_tokenizer

    return len(load_tokenizer(path).get_vocab())


def _embedded(path: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).vocab_size
