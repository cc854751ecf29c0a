"""Token bookkeeping for multi-turn chats without re-templating past turns.

The chat template is applied once to find three fixed pieces of token ids, and every later turn is
built by appending: the engine's generated ids are kept exactly, then the ids that close the
assistant turn, then the ids of the next user turn and the generation prompt. Re-applying the
template to the whole history each turn can tokenize earlier turns differently from how they were
generated, and PPO would then score tokens the policy never produced.
"""

from __future__ import annotations

from roll.models.loading import chat_template_ids

_PROBE_SYSTEM, _PROBE_USER = "s", "u"
_MEMO_SIZE = 65536
_MEMO: dict = {}


class ChatFormatter:
    def __init__(self, tokenizer, response_prefix: str = ""):
        self.tokenizer = tokenizer
        self.response_prefix = response_prefix
        self.prefix_ids = tokenizer.encode(response_prefix, add_special_tokens=False) if response_prefix else []
        self.eos_token_id = tokenizer.eos_token_id
        probe = [{"role": "system", "content": _PROBE_SYSTEM}, {"role": "user", "content": _PROBE_USER}]
        with_gen = chat_template_ids(tokenizer, probe, add_generation_prompt=True)
        closed = chat_template_ids(tokenizer, probe + [{"role": "assistant", "content": ""}], False)
        if closed[: len(with_gen)] != with_gen:
            raise ValueError("chat template: an empty assistant turn does not extend the generation prompt")
        self._closed_probe = closed
        self.turn_close_ids = closed[len(with_gen):]  # e.g. <|im_end|> \n

    def template_ids(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        """`chat_template_ids`, memoised across the formatters of this process (all managers of an
        env worker): the envs of a group start from one state and often revisit states."""
        key = (id(self.tokenizer), tuple((m["role"], m["content"]) for m in messages), add_generation_prompt)
        ids = _MEMO.get(key)
        if ids is None:
            if len(_MEMO) >= _MEMO_SIZE:
                _MEMO.clear()
            ids = _MEMO[key] = chat_template_ids(self.tokenizer, messages, add_generation_prompt)
        return list(ids)

    def initial_prompt(self, instruction: str | None, observation: str) -> list[int]:
        messages = [{"role": "user", "content": observation}]
        if instruction:
            messages.insert(0, {"role": "system", "content": instruction})
        return self.template_ids(messages, add_generation_prompt=True) + self.prefix_ids

    def next_turn(self, observation: str, generated_ids: list[int]) -> list[int]:
        """Ids to append after a generated turn: what closes it, then the next user turn."""
        close = self.turn_close_ids
        if generated_ids and close and generated_ids[-1] == close[0] == self.eos_token_id:
            close = close[1:]  # the model already emitted the end-of-turn token
        return close + self._user_turn_ids(observation) + self.prefix_ids

    def response_text(self, generated_ids: list[int]) -> str:
        """The text the env parses: the forced prefix plus what the model wrote."""
        return self.response_prefix + self.tokenizer.decode(generated_ids, skip_special_tokens=True)

    def _user_turn_ids(self, observation: str) -> list[int]:
        probe = [
            {"role": "system", "content": _PROBE_SYSTEM},
            {"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": observation},
        ]
        ids = self.template_ids(probe, add_generation_prompt=True)
        if ids[: len(self._closed_probe)] != self._closed_probe:
            raise ValueError("chat template renders earlier turns differently once a turn is added")
        return ids[len(self._closed_probe):]
