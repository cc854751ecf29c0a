"""Token bookkeeping for multi-turn chats without re-templating past turns.

The chat template renders the first prompt once. After that, every turn is built by appending:
the engine's generated ids are kept exactly, then the ids the template puts after an assistant
turn (what closes it, the next user turn, the generation prompt), found from a probe conversation
(`roll.models.chat_template.continuation_ids`). Re-applying the template to the whole history each
turn can tokenize earlier turns differently from how they were generated (Qwen3's template drops
the `<think>` block of earlier turns), and PPO would then score tokens the policy never produced.
"""

from __future__ import annotations

from roll.models.chat_template import chat_template_ids, continuation_ids

_MEMO_SIZE = 65536
_MEMO: dict = {}
_OWNERS: dict[int, object] = {}
"""The tokenizers whose ids key the memo, held while it holds their entries: an id is unique only
among live objects, and a tokenizer made after another was freed may get its id."""


def _memoised(tokenizer, key: tuple, compute) -> list[int]:
    """Ids memoised across the formatters of this process (all managers of an env worker): the envs
    of a group start from one state and often revisit states."""
    return list(_memo(tokenizer, key, compute))


def _memo(tokenizer, key: tuple, compute):
    """The memo's value for (`tokenizer`, `key`), computed once (the memo is emptied when full)."""
    full_key = (id(tokenizer), *key)
    value = _MEMO.get(full_key)
    if value is None:
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.clear()
            _OWNERS.clear()
        _OWNERS[id(tokenizer)] = tokenizer
        value = _MEMO[full_key] = compute()
    return value


class ChatFormatter:
    def __init__(self, tokenizer, response_prefix: str = ""):
        self.tokenizer = tokenizer
        self.response_prefix = response_prefix
        self.prefix_ids = tokenizer.encode(response_prefix, add_special_tokens=False) if response_prefix else []
        self.eos_token_id = tokenizer.eos_token_id

    def template_ids(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        """`chat_template_ids` of `messages`, memoised."""
        key = (tuple((m["role"], m["content"]) for m in messages), add_generation_prompt)
        return _memoised(
            self.tokenizer, key, lambda: chat_template_ids(self.tokenizer, messages, add_generation_prompt)
        )

    def initial_prompt(self, instruction: str | None, observation: str) -> list[int]:
        messages = [{"role": "user", "content": observation}]
        if instruction:
            messages.insert(0, {"role": "system", "content": instruction})
        return self.template_ids(messages, add_generation_prompt=True) + self.prefix_ids

    def next_turn(self, observation: str, generated_ids: list[int]) -> list[int]:
        """Ids to append after a generated turn: what closes it, then the next user turn."""
        ids = self.turn_ids(observation)
        if generated_ids and ids and generated_ids[-1] == ids[0] == self.eos_token_id:
            ids = ids[1:]  # the model already emitted the end-of-turn token
        return ids + self.prefix_ids

    def turn_ids(self, observation: str) -> list[int]:
        """What follows an assistant turn when the next user message is `observation`."""
        message = {"role": "user", "content": observation}
        return _memoised(self.tokenizer, ("turn", observation), lambda: continuation_ids(self.tokenizer, [message]))

    def response_text(self, generated_ids: list[int]) -> str:
        """The text the env parses: the forced prefix plus what the model wrote."""
        key = ("text", self.response_prefix, tuple(generated_ids))  # read twice a turn
        return _memo(
            self.tokenizer,
            key,
            lambda: self.response_prefix + self.tokenizer.decode(generated_ids, skip_special_tokens=True),
        )
