"""A dataset of agent rows standing in for an env: `custom_envs.<Tag>.env_type: agent`.

Each row names the agent that plays it, ChatLearn's convention: `agent_name` (a registered name or
`package.module:ClassName`) and `agent_cfg_path` (its YAML; a relative path resolves against the
dataset file's directory, so a dataset and its agent configs move together). Every other field
(`prompt` or `messages`, `answer`, ...) reaches the agent and its reward fn untouched.
`env_config.agent_name` / `env_config.agent_cfg_path` are the defaults for rows that leave them out.

Which row an episode plays is a pure function of its `env_seed` (`row_for_seed`): the members of a
group share the env seed, hence the question, and differ only by their sampling seed, which is what
GRPO needs to compare answers to one question.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roll.agentic.agent_loop.registry import RegisteredAgent

AGENT_ENV_TYPE = "agent"
ENV_CONFIG_KEYS = ("dataset", "agent_name", "agent_cfg_path")


class AgentDatasetError(ValueError):
    """A dataset or agent config problem; `key` is the env_config key at fault."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class AgentDataset:
    """The rows of one dataset file, each with its resolved `agent_name` and `agent_cfg_path`."""

    path: str
    rows: tuple[dict, ...]

    def row_for_seed(self, env_seed: int) -> dict:
        """The row an episode with `env_seed` plays (the same seed, the same row)."""
        return dict(self.rows[int(env_seed) % len(self.rows)])

    @property
    def agents(self) -> list[tuple[str, str]]:
        """The distinct (agent_name, agent_cfg_path) pairs, in order of first use."""
        return list(dict.fromkeys((r["agent_name"], r["agent_cfg_path"]) for r in self.rows))


def read_rows(path: str) -> list[dict]:
    """Rows of a `.jsonl` / `.json` (a list) or `.parquet` file, as dicts."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise AgentDatasetError("dataset", f"reading {path!r} needs pyarrow (pip install pyarrow)") from None
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            rows = json.load(f)
        else:
            rows = []
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise AgentDatasetError("dataset", f"{path!r} line {n} is not JSON ({e.msg})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise AgentDatasetError("dataset", f"{path!r} must hold JSON objects, one per row")
    return rows


def load_agent_dataset(env_config: Mapping[str, Any]) -> AgentDataset:
    """The dataset `env_config` names, every row given its agent (cached: workers and config
    validation read a file once per process)."""
    unknown = sorted(set(env_config) - set(ENV_CONFIG_KEYS))
    if unknown:
        raise AgentDatasetError(unknown[0], f"unknown key for env_type 'agent'; accepted: {', '.join(ENV_CONFIG_KEYS)}")
    path = env_config.get("dataset")
    if not path:
        raise AgentDatasetError("dataset", "required for env_type 'agent' (a .jsonl or .parquet file)")
    return _load(os.path.abspath(str(path)), env_config.get("agent_name"), env_config.get("agent_cfg_path"))


@lru_cache(maxsize=16)
def _load(path: str, default_name: str | None, default_cfg: str | None) -> AgentDataset:
    if not os.path.isfile(path):
        raise AgentDatasetError("dataset", f"{path!r} does not exist")
    base = os.path.dirname(path)
    rows = []
    for i, row in enumerate(read_rows(path)):
        name, cfg = row.get("agent_name") or default_name, row.get("agent_cfg_path") or default_cfg
        if not name:
            raise AgentDatasetError("dataset", f"{path!r} row {i} has no agent_name (nor env_config.agent_name)")
        cfg = os.path.normpath(os.path.join(base, str(cfg))) if cfg else ""
        rows.append({**row, "agent_name": str(name), "agent_cfg_path": cfg})
    if not rows:
        raise AgentDatasetError("dataset", f"{path!r} has no rows")
    return AgentDataset(path, tuple(rows))


def check_agent_env_config(env_config: Mapping[str, Any]) -> AgentDataset:
    """Everything that can be checked before Ray starts: the file, each row's agent name, and
    each agent config (its keys, its tools and reward fn importable). Raises `AgentDatasetError`."""
    from roll.agentic.agent_loop.registry import get_agent_class, load_agent_cfg

    dataset = load_agent_dataset(env_config)
    for name, cfg_path in dataset.agents:
        try:
            cls = get_agent_class(name)
        except ValueError as e:
            raise AgentDatasetError("dataset", f"{dataset.path!r}: {e}") from None
        if not cfg_path:
            continue
        try:
            cfg = load_agent_cfg(cfg_path)
            check_agent_cfg(cls, cfg)
        except (ValueError, TypeError, ImportError, OSError) as e:
            raise AgentDatasetError("agent_cfg_path", f"{cfg_path!r}: {e}") from None
    return dataset


def check_agent_cfg(cls: type[RegisteredAgent], cfg: Mapping[str, Any]) -> None:
    """Unknown keys, and tools / reward fn that do not import, as one-line errors."""
    from roll.agentic.agent_loop.base import resolve_reward_fn
    from roll.agentic.agent_loop.tools import tool_map

    defaults = getattr(cls, "defaults", {})
    unknown = sorted(set(cfg) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {', '.join(map(repr, unknown))} for agent "
            f"{cls.agent_name!r}; accepted: {', '.join(sorted(defaults))}"
        )
    if cfg.get("tools"):
        tool_map(cfg["tools"])
    if isinstance(cfg.get("reward_fn"), str):
        try:
            resolve_reward_fn(cfg["reward_fn"])
        except (AttributeError, ImportError) as e:
            raise ValueError(f"reward_fn {cfg['reward_fn']!r} not found ({e})") from None


def agent_corpus(env_config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What a tiny word-level tokenizer must cover to play this dataset: the rows' prompts and
    answers, each agent's system prompt and tool description, and tool results; and the tokens
    to keep whole: the tool-call tags, and the quoted JSON names of the call format and of every
    tool and argument (so that a call the model writes decodes to valid JSON)."""
    import json as _json

    from roll.agentic.agent_loop.registry import load_agent_cfg
    from roll.agentic.agent_loop.tool_agent import TOOLS_SYSTEM_PROMPT
    from roll.agentic.agent_loop.tools import tool_map

    dataset = check_agent_env_config(env_config)
    texts = [str(r.get(k, "")) for r in dataset.rows for k in ("prompt", "answer", "solution")]
    texts += [m.get("content", "") for r in dataset.rows for m in r.get("messages") or []]
    extra = ["<tool_call>", "</tool_call>", '"name"', '"arguments"']
    for _, cfg_path in dataset.agents:
        cfg = load_agent_cfg(cfg_path) if cfg_path else {}
        texts.append(str(cfg.get("system_prompt") or ""))
        tools = tool_map(cfg.get("tools") or [])
        schemas = "\n".join(_json.dumps(t.schema["function"]) for t in tools.values())
        texts.append(TOOLS_SYSTEM_PROMPT.format(schemas=schemas))
        texts.append(
            "Error: unknown tool; available: invalid arguments for timed out after raised "
            "unsupported element not an arithmetic expression division by zero truncated"
        )
        for tool in tools.values():
            params = tool.schema["function"]["parameters"].get("properties", {})
            extra += [f'"{tool.name}"', *(f'"{p}"' for p in params)]
    return texts, list(dict.fromkeys(extra))
