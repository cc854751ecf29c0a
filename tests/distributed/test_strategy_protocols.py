"""Every registered engine class meets its declared interface (roll.distributed.strategies.base).

Checked on the classes with `inspect`, not with `isinstance` (a runtime-checkable Protocol only
looks for names): each method of the Protocol is present on the engine, takes the same parameters
in the same order and kind, keeps the Protocol's defaults, adds parameters only with defaults, and
states the same return type; each attribute is set by the class (a class attribute or a
`self.<name> = ...` in one of its methods, its bases' included).
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from roll.distributed.strategies.base import InferStrategy, TrainStrategy
from roll.distributed.strategies.registry import INFER_STRATEGIES, TRAIN_STRATEGIES, strategy_class

ENGINES = [(name, "train", TrainStrategy) for name in TRAIN_STRATEGIES] + [
    (name, "infer", InferStrategy) for name in INFER_STRATEGIES
]


def protocol_members(protocol: type) -> tuple[list[str], list[str]]:
    """(methods, attributes) the Protocol declares itself; a read-only property is an attribute."""
    methods = [name for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("_")]
    properties = [name for name, value in vars(protocol).items() if isinstance(value, property)]
    return methods, list(protocol.__annotations__) + properties


def signature_mismatches(method: str, declared: inspect.Signature, actual: inspect.Signature) -> list[str]:
    """Why a call the Protocol allows could fail on the engine's method (empty: compatible)."""
    found = []
    want = list(declared.parameters.values())
    have = list(actual.parameters.values())
    for i, param in enumerate(want):
        if i >= len(have):
            found.append(f"{method}: lacks parameter {param.name!r}")
            continue
        got = have[i]
        if (got.name, got.kind) != (param.name, param.kind):
            found.append(f"{method}: parameter {i} is {got.name!r} ({got.kind.name}), want {param.name!r}")
        elif param.default is not inspect.Parameter.empty and got.default != param.default:
            found.append(f"{method}: {param.name}'s default is {got.default!r}, want {param.default!r}")
        elif param.annotation is not inspect.Parameter.empty and got.annotation != param.annotation:
            found.append(f"{method}: {param.name} is {got.annotation!r}, want {param.annotation!r}")
    for got in have[len(want) :]:
        if got.default is inspect.Parameter.empty and got.kind not in (got.VAR_POSITIONAL, got.VAR_KEYWORD):
            found.append(f"{method}: extra parameter {got.name!r} without a default")
    if declared.return_annotation != actual.return_annotation:
        found.append(f"{method}: returns {actual.return_annotation!r}, want {declared.return_annotation!r}")
    return found


def assigned_attributes(cls: type) -> set[str]:
    """Names set on instances (`self.a = `, `self.a, self.b = `, `self.a: T = `) in the methods of
    `cls` and its bases, and the class attributes."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        if klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                        names.add(leaf.attr)
    return names


def engine_class(name: str, kind: str) -> type:
    """The engine class, or a skip that names the optional package its import lacks."""
    try:
        return strategy_class(name, kind=kind)
    except ModuleNotFoundError as error:
        pytest.skip(f"{name}: its package {error.name!r} is not installed here")


@pytest.mark.parametrize(("name", "kind", "protocol"), ENGINES, ids=[name for name, *_ in ENGINES])
def test_engine_meets_its_protocol(name: str, kind: str, protocol: type) -> None:
    cls = engine_class(name, kind)
    methods, attributes = protocol_members(protocol)
    problems = []
    for method in methods:
        impl = getattr(cls, method, None)
        if not callable(impl):
            problems.append(f"{method}: missing")
            continue
        declared = inspect.signature(getattr(protocol, method))
        problems += signature_mismatches(method, declared, inspect.signature(impl))
    present = assigned_attributes(cls)
    problems += [f"{attr}: never set" for attr in attributes if attr not in present]
    assert problems == [], f"{cls.__module__}.{cls.__qualname__} does not meet {protocol.__name__}"


def test_the_protocols_name_what_the_workers_call() -> None:
    train_methods, train_attributes = protocol_members(TrainStrategy)
    infer_methods, infer_attributes = protocol_members(InferStrategy)
    assert set(train_methods) >= {"forward_logprobs", "forward", "train_step", "state_dict", "save_checkpoint"}
    assert set(train_attributes) >= {"model", "dp_rank", "dp_size", "param_counts"}
    assert set(infer_methods) >= {"generate_batch", "load_weights", "offload", "reload", "release"}
    assert set(infer_attributes) >= {"policy_version", "stats", "kv_cache"}


def test_the_check_catches_an_incompatible_engine() -> None:
    class Wrong:
        def __init__(self) -> None:
            self.policy_version = 0

        def generate_batch(self, requests, extra) -> list[GenerateOutput]:  # noqa: F821
            return []

        def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:  # noqa: F821
            pass

    declared = inspect.signature(InferStrategy.generate_batch)
    assert signature_mismatches("generate_batch", declared, inspect.signature(Wrong.generate_batch))
    declared = inspect.signature(InferStrategy.load_weights)
    assert "load_weights: lacks parameter 'version'" in signature_mismatches(
        "load_weights", declared, inspect.signature(Wrong.load_weights)
    )
    assert "stats" not in assigned_attributes(Wrong) and "policy_version" in assigned_attributes(Wrong)
