"""The purchase reward of the WebShop paper (Yao et al. 2022, section 3.2), in our own terms.

    r = r_type * (matched attributes + matched options + [price <= price_upper])
                 / (goal attributes + goal options + 1)

Where the paper matches with fuzzy scores (rapidfuzz `token_set_ratio` > 85) and spaCy nouns, we
use exact rules that a test can work out by hand:
- A goal attribute matches when its words are a subset of the words of one of the bought
  product's attributes (the case where `token_set_ratio` is 100), or when the attribute phrase
  occurs in the bought product's title, features or description (as in the paper), ignoring case.
- A goal option matches when one chosen option value equals it, ignoring case and spacing. (The
  paper's fuzzy match also pays "black" for "black | white".)
- `r_type`, the product-type factor: 1.0 for the goal product itself. For another product, let
  `title_score` be the share of the goal title's words (lower-case, alphabetic, 3+ letters, not
  stop words, in place of the paper's nouns) that the bought title also has. Then, in this order:
  0.0 if `title_score` is 0; 0.1 if it is below 0.1; 1.0 if the two products share their search
  `query`, or at least two levels of `product_category`, or `title_score` > 0.2; else 0.5.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from bm25s.stopwords import STOPWORDS_EN

from envs.webshop.catalog import Product
from envs.webshop.goals import Goal

_WORD = re.compile(r"[a-z0-9]+")
_TITLE_WORD = re.compile(r"[a-z]{3,}")
_CATEGORY_SEPARATOR = re.compile(r"›|>")


@dataclass(frozen=True)
class PurchaseReward:
    """The reward of one purchase and its parts (counts, so tests can check them exactly)."""

    attributes_matched: int
    num_attributes: int
    options_matched: int
    num_options: int
    price_ok: bool
    type_factor: float

    @property
    def total(self) -> float:
        matched = self.attributes_matched + self.options_matched + int(self.price_ok)
        return self.type_factor * matched / (self.num_attributes + self.num_options + 1)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _normalised(text: str) -> str:
    return " ".join(text.lower().split())


def attribute_matches(goal_attribute: str, product: Product) -> bool:
    """Whether the bought `product` has `goal_attribute` (see the module docstring)."""
    wanted = _words(goal_attribute)
    if wanted and any(wanted <= _words(attribute) for attribute in product.attributes):
        return True
    phrase = _normalised(goal_attribute)
    texts = (product.title, " ".join(product.bullet_points), product.description)
    return bool(phrase) and any(phrase in _normalised(text) for text in texts)


def title_score(goal_title: str, bought_title: str) -> float:
    """Share of the goal title's content words that the bought title has too."""
    wanted = set(_TITLE_WORD.findall(goal_title.lower())) - set(STOPWORDS_EN)
    if not wanted:
        return 0.0
    return len(wanted & set(_TITLE_WORD.findall(bought_title.lower()))) / len(wanted)


def _category_levels(product_category: str) -> set[str]:
    return {level.strip().lower() for level in _CATEGORY_SEPARATOR.split(product_category)} - {""}


def type_factor(goal_product: Product, bought: Product) -> float:
    """`r_type` of the module docstring."""
    if bought.asin == goal_product.asin:
        return 1.0
    score = title_score(goal_product.title, bought.title)
    if score == 0.0:
        return 0.0
    if score < 0.1:
        return 0.1
    same_query = bool(goal_product.query) and goal_product.query == bought.query
    shared = _category_levels(goal_product.product_category) & _category_levels(bought.product_category)
    return 1.0 if same_query or len(shared) >= 2 or score > 0.2 else 0.5


def purchase_reward(goal: Goal, goal_product: Product, bought: Product, chosen: Mapping[str, str]) -> PurchaseReward:
    """The reward for buying `bought` (at its `price`) with options `chosen` (name -> value)."""
    chosen_values = {_normalised(v) for v in chosen.values()}
    return PurchaseReward(
        attributes_matched=sum(attribute_matches(a, bought) for a in goal.attributes),
        num_attributes=len(goal.attributes),
        options_matched=sum(_normalised(v) in chosen_values for v in goal.options.values()),
        num_options=len(goal.options),
        price_ok=bought.price <= goal.price_upper,
        type_factor=type_factor(goal_product, bought),
    )
