"""WebShop (Yao et al. 2022) as a text env: buy the product an instruction asks for.

The env is a client of a real shop server on 127.0.0.1 (`envs.webshop.server`, shared by the
envs of a process): each action fetches a page over HTTP and the observation is that page as
text, in WebShop's "simple" style: `[Back to Search] [Next >]`, `[B09ABCDEF] Title $12.99`.

Actions: `search[query]` where the page has the search box, `click[label]` for a `[label]` on the
page (asins, option values, `Buy Now`, `Back to Search`, `Next >`, `< Prev`, `Description`,
`Features`), both inside `<answer>...</answer>`, case- and space-insensitive. Anything else is
invalid: no state change and `format_penalty` (WebShop answers a wrong click with the same page).
Buying ends the episode with the paper's reward (`envs.webshop.reward`); `max_steps` valid actions
without a purchase truncate it. After the purchase every well-formed action is a no-op.
`reset` adds the goal to the info: `info["goal"]` = {asin, instruction, attributes, options,
price_upper}. The goal's instruction is the episode's `env_instruction` (with the task and the
action format) and is also on the search page, as on WebShop's pages, so a prompt without the
env's instruction still has it while the agent is on that page.
`mark_asked_options=True` (a prompt aid for small models) follows each option value on a product
page that the instruction asks for with `(asked)`, e.g. `color: [white] (asked) [grey]`: what
the instruction says, put beside the label to click.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np

from envs.webshop import pages
from envs.webshop.catalog import clean_text, load_catalog
from envs.webshop.client import ShopClient, ShopConnectionError
from envs.webshop.expert import asked_option_click, expert_action
from envs.webshop.goals import Goal, make_goal, sample_goal
from envs.webshop.page_text import Page, normalise_label, parse_page
from envs.webshop.search import TOP_K
from envs.webshop.server import acquire_server, release_server
from roll.agentic.env import TextEnv, extract_answer
from roll.agentic.env.base import MAX_TEXT_CHARS

TASK = "You are shopping on WebShop. Find and buy the product that the instruction asks for."
ACTION_FORMAT = (
    "Answer with one action, like <answer>search[red running shoes]</answer> or <answer>click[Buy Now]</answer>."
)
ASKED = "(asked)"
MAX_QUERY_CHARS = 200
_ACTION = re.compile(r"\s*(search|click)\s*\[(.*)\]\s*", re.IGNORECASE | re.DOTALL)
_env_numbers = itertools.count()


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")


def _resolved(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


class WebShopEnv(TextEnv):
    """Find and buy the goal product in a shop served over HTTP; see the module docstring.

    `episode_metrics`: `purchased` (0/1), the purchase's `reward_attributes` and `reward_options`
    (shares of the goal's attributes / options matched, 1.0 when it has none), `reward_price`
    (0/1), `reward_type` (the type factor) — all 0 before a purchase — `num_searches`, and
    `chose_option` (0/1: some click of the episode selected an option on a product page).
    """

    # Open text: search[...] and click[...] on what the page shows (see parse_action).
    actions: tuple[str, ...] = ()

    def __init__(
        self,
        products_file: str | None = None,
        attributes_file: str | None = None,
        num_products: int | None = None,
        max_steps: int = 15,
        results_per_page: int = 10,
        request_timeout_s: float = 10.0,
        request_retries: int = 2,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
        env_instruction: str | None = None,
        observation_mode: str = "text",
        mark_asked_options: bool = False,
    ) -> None:
        super().__init__(format_penalty=format_penalty, render_mode=render_mode, env_instruction=env_instruction)
        if observation_mode != "text":  # ROLL's key; its html/image modes are not built here
            raise ValueError(f"observation_mode {observation_mode!r}: only 'text' is supported")
        if num_products is not None:
            _check_int("num_products", num_products, 1)
        _check_int("max_steps", max_steps, 1)
        _check_int("results_per_page", results_per_page, 1, TOP_K)
        _check_int("request_retries", request_retries, 0)
        if isinstance(request_timeout_s, bool) or not (
            isinstance(request_timeout_s, int | float) and request_timeout_s > 0
        ):
            raise ValueError(f"request_timeout_s must be a number > 0, got {request_timeout_s!r}")
        if not isinstance(mark_asked_options, bool):
            raise ValueError(f"mark_asked_options must be true or false, got {mark_asked_options!r}")
        self.mark_asked_options = mark_asked_options
        self._catalog_key = (_resolved(products_file), _resolved(attributes_file), num_products)
        self.catalog = load_catalog(*self._catalog_key)  # fails early on a bad file
        self.max_steps = max_steps
        self.results_per_page = results_per_page
        self.request_timeout_s = float(request_timeout_s)
        self.request_retries = request_retries
        self._sid = f"env{os.getpid()}-{next(_env_numbers)}"
        self._client: ShopClient | None = None
        self._release: weakref.finalize | None = None
        self._goal: Goal | None = None
        self._page = Page(text="")
        self._purchase: dict[str, str] | None = None
        self._num_valid = 0
        self._num_searches = 0
        self._chose_option = False

    # --- gymnasium API ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """`TextEnv.reset`, plus `info["goal"]` (the goal as plain data)."""
        obs, info = super().reset(seed=seed, options=options)
        assert self._goal is not None  # every _reset samples or makes one
        info["goal"] = self._goal.as_info()
        return obs, info

    def close(self) -> None:
        """End this env's session and drop its use of the shared server."""
        if self._client is not None:
            # the server may be gone already (stopped at exit): then there is nothing to end
            with contextlib.suppress(ShopConnectionError):
                self._client.post(f"/s/{self._sid}/end", {})
            self._client = None
            assert self._release is not None  # set with the client
            self._release()
        super().close()

    # --- TextEnv hooks ---------------------------------------------------------------------
    @property
    def success(self) -> bool:
        return self._purchase is not None and float(self._purchase["reward"]) == 1.0

    def _connect(self) -> ShopClient:
        """The client of the shared server, which the first call starts (the server stays up
        until `close()` or until this env is garbage-collected)."""
        if self._client is None:
            server = acquire_server(self._catalog_key)
            client = ShopClient(server.url, self.request_timeout_s, self.request_retries)
            self._release = weakref.finalize(self, _disconnect, client, self._catalog_key)
            self._client = client
        return self._client

    def _reset(self, options: dict[str, Any]) -> str:
        if options:
            raise ValueError(f"WebShopEnv.reset takes no options, got {sorted(options)}")
        client = self._connect()
        self._goal = sample_goal(self.catalog, self.np_random)
        self.instruction = f"{TASK}\nInstruction: {self._goal.instruction}\n{ACTION_FORMAT}"
        fields = {
            "asin": self._goal.asin,
            "price_upper": repr(self._goal.price_upper),
            "per_page": str(self.results_per_page),
            **{pages.OPTION_PREFIX + name: v for name, v in self._goal.options.items()},
        }
        self._page = parse_page(client.post(f"/s/{self._sid}/start", fields))
        self._purchase = None
        self._num_valid = self._num_searches = 0
        self._chose_option = False
        return self._observation()

    def parse_action(self, text: str) -> str | None:
        """`search[query]` / `click[label]` (canonical spelling) if the current page allows it,
        any well-formed action after the purchase, else None."""
        content = extract_answer(text)
        found = _ACTION.fullmatch(content) if content is not None else None
        if found is None:
            return None
        kind, argument = found[1].lower(), " ".join(found[2].split())
        if kind == "search":  # a query is sent over HTTP: only characters of the charset
            argument = clean_text(argument)[:MAX_QUERY_CHARS].strip()
        if not argument:
            return None
        if self._purchase is not None:
            return f"{kind}[{argument}]"
        if kind == "search":
            return f"search[{argument}]" if self._page.search_action is not None else None
        clickable = self._page.clickables.get(normalise_label(argument))
        return None if clickable is None else f"click[{clickable[0]}]"

    def _apply(self, action: str) -> tuple[str, float, bool, bool]:
        if self._purchase is not None:
            return self._observation(), 0.0, True, False
        match = _ACTION.fullmatch(action)
        assert match is not None  # parse_action returns only text of this form
        kind, argument = match.groups()
        self._num_valid += 1
        if kind == "search":
            self._num_searches += 1
            path = f"{self._page.search_action}?{urlencode({'q': argument})}"
        else:
            path = self._page.clickables[normalise_label(argument)][1]
        self._page = parse_page(self._connect().get(path))
        self._chose_option |= kind == "click" and argument in self._page.selected  # the label as shown
        self._purchase = self._page.reward
        reward = 0.0 if self._purchase is None else float(self._purchase["reward"])
        terminated = self._purchase is not None
        truncated = not terminated and self._num_valid >= self.max_steps
        return self._observation(), reward, terminated, truncated

    def _observation(self) -> str:
        """The page's text; with `mark_asked_options`, on a product page each asked option value
        followed by `ASKED` (only on its option's line: `name: [v1] [v2] ...`)."""
        text = self._page.text
        if self.mark_asked_options and self._goal is not None and self._page.data.get("page") == "item":
            lines = text.split("\n")
            for i, line in enumerate(lines):
                name, sep, values = line.partition(": ")
                wanted = self._goal.options.get(name) if sep else None
                if wanted is not None:
                    lines[i] = f"{name}: " + values.replace(f"[{wanted}]", f"[{wanted}] {ASKED}", 1)
            text = "\n".join(lines)
        return text[:MAX_TEXT_CHARS]

    def episode_metrics(self) -> dict[str, float]:
        bought = self._purchase
        if bought is None:
            parts = dict.fromkeys(("reward_attributes", "reward_options", "reward_price", "reward_type"), 0.0)
        else:
            parts = {
                "reward_attributes": _share(bought["attributes-matched"], bought["num-attributes"]),
                "reward_options": _share(bought["options-matched"], bought["num-options"]),
                "reward_price": float(bought["price-ok"]),
                "reward_type": float(bought["type-factor"]),
            }
        score = 0.0 if bought is None else float(bought["reward"])  # the paper's score, 0 unbought
        return {
            "purchased": float(bought is not None),
            "score": score,
            **parts,
            "num_searches": float(self._num_searches),
            "chose_option": float(self._chose_option),
        }

    def scripted_action(self) -> str | None:
        if self._goal is None:
            return None
        title = self.catalog.by_asin[self._goal.asin].title
        return expert_action(self._page, self._goal, title, self._num_searches)

    def sample_valid_action(self, rng: np.random.Generator) -> str | None:
        """On the search page a query of 2-5 consecutive words of the goal's instruction, elsewhere
        a uniformly random click among the page's labels; None once bought (or before `reset`)."""
        if self._goal is None or self._purchase is not None:
            return None
        if self._page.search_action is not None:
            words = clean_text(self._goal.instruction).split()
            length = min(len(words), int(rng.integers(2, 6)))
            start = int(rng.integers(len(words) - length + 1))
            return f"<answer>search[{' '.join(words[start : start + length])}]</answer>"
        labels = sorted(label for label, _ in self._page.clickables.values())
        return f"<answer>click[{labels[int(rng.integers(len(labels)))]}]</answer>"

    def sample_shopper_action(self, rng: np.random.Generator) -> str | None:
        """A warm-start teacher between the random shopper and the oracle: it searches as
        `sample_valid_action` does and opens a random product of the results page; on a product
        page it chooses the asked option values (those `mark_asked_options` marks), one a turn,
        then buys; on a description or features page it goes back. None once bought (or before
        `reset`)."""
        if self._goal is None or self._purchase is not None:
            return None
        kind = self._page.data.get("page")
        if kind == "results":
            products = sorted(label for label, _ in self._page.clickables.values() if label in self.catalog.by_asin)
            if products:
                return f"<answer>click[{products[int(rng.integers(len(products)))]}]</answer>"
        if kind == "item":
            return asked_option_click(self._page, self._goal) or f"<answer>click[{pages.BUY_NOW}]</answer>"
        if kind in pages.SUB_PAGES:
            return f"<answer>click[{pages.PREV}]</answer>"
        return self.sample_valid_action(rng)

    def tokenizer_whole_words(self) -> list[str]:
        """The product codes (ASINs), each one token of a tiny word-level tokenizer: clicking a
        product means copying its code from the page, which a 2-layer model trained in minutes
        does not learn for a code spelled as 10 one-character tokens (benchmarks/results/learning.md,
        WebShop)."""
        return [product.asin for product in self.catalog.products]

    def tokenizer_corpus(self) -> list[str]:
        """Every text a word-level tokenizer must cover for this catalog: the action syntax,
        the instruction, the pages' fixed words and each product as the pages show it."""
        texts = [TASK, ACTION_FORMAT, *pages.CHROME, *([ASKED] if self.mark_asked_options else [])]
        for product in self.catalog.products:
            texts += [product.asin, product.title, pages.clip(product.title, pages.TITLE_CHARS)]
            texts.append(product.price_text)
            texts += [f"{name}: {' '.join(values)}" for name, values in product.options]
            texts.append(pages.clip(product.description, pages.DESCRIPTION_CHARS))
            texts += [pages.clip(b, pages.FEATURE_CHARS) for b in product.bullet_points]
        for product in self.catalog.goal_products:
            options = {name: values[0] for name, values in product.options}
            texts.append(make_goal(product, options, 100.0).instruction)
        return texts


def _disconnect(client: ShopClient, catalog_key: tuple) -> None:
    """Close `client` and drop its env's use of the server: on `close()`, or when an env that
    was never closed is garbage-collected."""
    client.close()
    release_server(catalog_key)


def _share(matched: str, total: str) -> float:
    return 1.0 if int(total) == 0 else int(matched) / int(total)
