"""The sections of one role's config that say which model, how to train it and how to sample
from it (`model_args`, `data_args`, `training_args`, `generating_args`, with ROLL's keys); the role
itself and its engine are in `roll.configs.worker`."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from roll.configs.base import ConfigModel, InvalidField
from roll.configs.templates import check_template_name
from roll.core.records import SamplingParams


class ModelArgs(ConfigModel):
    """Which weights a role loads, in which precision, and how it trains them (LoRA, recompute)."""

    model_name_or_path: str | None = None
    """Local HF model dir. None: the top-level `pretrain` (for `critic`: `reward_pretrain`, else
    `pretrain`), filled in by `PipelineConfig`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype the weights are loaded in (`roll.models.loading`, as ROLL does: weights, not
    autocast). ROLL's spellings `fp32`, `bf16`, `fp16` are accepted. float32 is the safe choice on
    CPU; bfloat16 halves memory on GPU. A dtype the device cannot train in (float16 on CPU) falls
    back to float32 with one warning line. (ROLL's default is bf16; ours float32, for CPU runs.)"""
    attn_implementation: str | None = None
    """Attention kernel passed to `transformers`: "sdpa", "eager", "flash_attention_2"; ROLL's `fa2`
    / `flash_attn` mean flash_attention_2 where the flash-attn package is installed, else sdpa with
    one warning line. None (or ROLL's "auto") lets transformers choose."""
    disable_gradient_checkpointing: bool = True
    """ROLL's key: false turns gradient checkpointing ON for this role's training strategy (HF
    `activation_checkpointing_enable`, non-reentrant; megatron: every layer recomputed).
    Activations are recomputed in backward instead of kept: less memory, one more forward. ROLL
    defaults to false (on); we default to true (off), so a config that does not say keeps our
    earlier behaviour; ROLL's example configs say it explicitly. Losses and gradients are the same.
    Only training roles (`actor_train`, `critic`) train, so only they are affected."""
    lora_rank: int | None = Field(None, ge=1)
    """LoRA rank r (peft). Set: only LoRA adapters on `lora_target` train (the base weights are
    frozen); weight sync, `state_dict` and checkpoints hand out the merged full weights. None:
    every parameter trains. Applies to `actor_train` and `critic`; on `actor_infer` (ROLL serves the
    adapter with vLLM's LoRA) it is accepted and changes nothing, since the engine is sent the
    actor's merged weights; refused on `reference`. The megatron strategy puts the adapters on its
    fused layers (roll.distributed.strategies.megatron.lora)."""
    lora_alpha: int | None = Field(None, ge=1)
    """LoRA scale numerator: adapters add (alpha / r) * B A. None: 2 * `lora_rank`, as in ROLL."""
    lora_target: str | None = None
    """Modules that get adapters: `all-linear` (ROLL also writes `all`: every linear layer but the
    output head) or a comma list of module names, e.g. `q_proj,v_proj`. None with `lora_rank`
    set: all-linear. A name that matches no module of the model is a config error. With megatron
    the HF names map to its fused layers (q/k/v_proj -> linear_qkv, o_proj -> linear_proj,
    gate/up_proj -> linear_fc1, down_proj -> linear_fc2; those megatron names work too), and an
    adapter covers the whole fused layer."""
    ulysses_size: int | None = Field(None, ge=1)
    """ROLL's fsdp2 key: the degree of Ulysses sequence parallelism (attention heads split over this
    many ranks, each holding a slice of every sequence). roll builds no sequence parallelism, so
    only 1 (or null, the same) runs; `+profile=cpu_smoke` sets it to 1 with the other parallel
    degrees (one CPU process per role), which changes no number of the run."""
    model_type: Literal["causal_lm"] | None = None
    """ROLL's `model_type`: null (ROLL's default) loads the role's usual head: a causal LM for the
    policy roles, a token-classification value head for the critic. ROLL's other model types
    (diffusion, trl value-head wrappers) are not supported."""

    @field_validator("ulysses_size")
    @classmethod
    def _no_sequence_parallelism(cls, size: int | None) -> int | None:
        if size is not None and size > 1:
            raise ValueError(
                f"{size}: Ulysses sequence parallelism (ROLL's fsdp2) is not built in roll; use 1 "
                "(+profile=cpu_smoke sets it)"
            )
        return size

    @field_validator("model_name_or_path")
    @classmethod
    def _is_model_dir(cls, path: str | None) -> str | None:
        return path if path is None else check_model_dir(path)

    @field_validator("dtype", mode="before")
    @classmethod
    def _roll_dtype(cls, value: Any) -> Any:
        return ROLL_DTYPES.get(value, value)

    @field_validator("attn_implementation", mode="before")
    @classmethod
    def _roll_attention(cls, value: Any) -> Any:
        return None if value == "auto" else value

    @model_validator(mode="before")
    @classmethod
    def _older_attention_key(cls, data: Any) -> Any:
        """ROLL's older spelling `model_args.flash_attn: fa2` (its demo configs still carry it) is
        `attn_implementation`; both given with different values is refused."""
        if isinstance(data, dict) and "flash_attn" in data:
            data = dict(data)
            older = data.pop("flash_attn")
            if data.get("attn_implementation") not in (None, older):
                raise InvalidField(
                    "flash_attn",
                    f"is the older spelling of attn_implementation, which says "
                    f"{data['attn_implementation']!r}; keep one of them",
                )
            data["attn_implementation"] = older
        return data

    @field_validator("lora_target")
    @classmethod
    def _names_modules(cls, target: str | None) -> str | None:
        # "" or "q_proj,,v_proj" would otherwise fall back to all-linear, or to a module named ""
        if target is not None and not all(name.strip() for name in target.split(",")):
            raise ValueError(f"{target!r} names an empty module; write all-linear, or module names separated by commas")
        return target

    @model_validator(mode="after")
    def _lora_keys_need_rank(self) -> ModelArgs:
        if self.lora_rank is None:
            stray = next((k for k in ("lora_alpha", "lora_target") if getattr(self, k) is not None), None)
            if stray:
                raise InvalidField(stray, "has no effect without lora_rank; set lora_rank or remove it")
        return self

    @property
    def lora(self) -> dict | None:
        """`lora_rank`, `lora_alpha`, `lora_target` as `roll.models.lora.apply_lora`'s arguments
        (alpha and target filled in), or None when LoRA is off."""
        if self.lora_rank is None:
            return None
        return {
            "rank": self.lora_rank,
            "alpha": self.lora_alpha or 2 * self.lora_rank,
            "target": self.lora_target or "all-linear",
        }


ROLL_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""ROLL's dtype spellings, normalised to torch's names."""


class DataArgs(ConfigModel):
    """ROLL's `data_args` of a role."""

    template: str | None = None
    """Chat template by ROLL's name ("qwen2_5", "qwen3", "llama3", "chatml", "native": the
    tokenizer's own; `roll.models.templates`). None: the tokenizer's own. `actor_infer`'s template
    renders the env managers' prompts."""

    @field_validator("template")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        return name if name is None else check_template_name(name)


class TrainingArgs(ConfigModel):
    """Optimiser and batch sizes of a trained role. Ignored by roles that only infer."""

    learning_rate: float = Field(1e-6, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW first-moment decay."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW second-moment decay."""
    adam_epsilon: float = Field(1e-8, gt=0)
    """AdamW denominator epsilon."""
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    """Shape of the learning-rate schedule after warm-up, over the run's training steps (the
    top-level `max_steps`: the schedule advances once per pipeline step, however many optimiser
    steps the PPO epochs and mini-batches of that step take)."""
    warmup_steps: int = Field(0, ge=0)
    """Training (pipeline) steps of linear warm-up from 0 to `learning_rate`."""
    warmup_ratio: float = Field(0.0, ge=0, le=1)
    """HF's (and ROLL's) warm-up as a fraction of the run's training steps: ceil(warmup_ratio *
    max_steps) steps, used only when `warmup_steps` is 0 (`warmup_steps` wins, as in HF)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this global L2 norm before each optimiser step."""
    per_device_train_batch_size: int = Field(8, ge=1)
    """Micro-batch: samples in one forward/backward pass."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Micro-batches accumulated per optimiser step (see `mini_batch_size`)."""

    def warmup_for(self, total_steps: int) -> int:
        """Warm-up steps of a run of `total_steps` training steps (HF's `get_warmup_steps`)."""
        return self.warmup_steps if self.warmup_steps > 0 else math.ceil(self.warmup_ratio * total_steps)

    @property
    def mini_batch_size(self) -> int:
        """Samples per optimiser step, the PPO mini-batch, as in ROLL:
        `per_device_train_batch_size * gradient_accumulation_steps` per data-parallel rank; a role
        with `world_size` ranks steps on `world_size` times as many."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps


class GeneratingArgs(ConfigModel):
    """How `actor_infer` samples one response (one env step)."""

    max_new_tokens: int = Field(64, ge=1)
    """Most tokens generated per response. As in ROLL, an env step generates at most
    min(`max_new_tokens`, `custom_envs.<Tag>.max_tokens_per_step`) tokens, and never past
    `sequence_length`."""
    temperature: float = Field(1.0, ge=0)
    """Softmax temperature; 0 means greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass; 1.0 turns it off."""
    top_k: int = Field(0, ge=0)
    """Keep only the k most likely tokens; 0 turns it off (so does ROLL's and vLLM's -1)."""
    do_sample: bool = True
    """False means greedy decoding whatever the temperature (e.g. for validation)."""
    num_return_sequences: Literal[1] = 1
    """ROLL's key: samples per request. Agentic rollouts take one sample per env step (ROLL forces
    1 too); several samples of one start state are what `group_size` is for."""
    num_beams: Literal[1] = 1
    """ROLL's key: beam search width. Only 1 (sampling/greedy): RL needs the behaviour policy's
    own log-probs, which beam search does not give."""
    stop_strings: list[str] = Field(default_factory=list)
    """Generation stops after any of these; each must be a single token of the tokenizer, which
    the pipeline checks once it has loaded the tokenizer."""
    ignore_eos: bool = False
    """Go on past the end-of-text token, stopping only at `stop_strings` or the length (vLLM's
    `ignore_eos`): fixes response lengths, for benchmarks; a trained policy needs its EOS."""

    @field_validator("top_k", mode="before")
    @classmethod
    def _minus_one_is_off(cls, value: Any) -> Any:
        return 0 if value == -1 and not isinstance(value, bool) else value

    def to_sampling_params(
        self, max_new_tokens: int | None = None, stop_token_ids: Sequence[int] = ()
    ) -> SamplingParams:
        """The engine-level record for one request.

        `max_new_tokens` replaces `self.max_new_tokens` when given (an env's
        `max_tokens_per_step`); `stop_token_ids` are the ids of `stop_strings` and the EOS, which
        only the caller can know because they need the tokenizer.
        """
        return SamplingParams(
            max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            do_sample=self.do_sample,
            stop_token_ids=list(stop_token_ids),
            ignore_eos=self.ignore_eos,
        )


def check_model_dir(path: str) -> str:
    """`path` if it is a local HF model dir, else a ValueError that says how to make one.

    Only local dirs: runs must not depend on a download (and the tiny model is built locally).
    """
    if not os.path.isfile(os.path.join(path, "config.json")):
        if re.fullmatch(r"[\w.-]+/[\w.-]+", path) and not os.path.exists(path):
            raise ValueError(
                f"{path!r} looks like a hub id; roll loads local model directories only and no "
                "hub is reached from here: download the model where there is network "
                "(huggingface-cli download / modelscope download) and pass its local dir"
            )
        raise ValueError(
            f"{path!r} is not a local model directory (no config.json); build the tiny model "
            "with `python -m roll.pipeline.tiny_model --output_dir DIR` and point to DIR"
        )
    return path
