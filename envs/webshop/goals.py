"""Shopping goals: which product to buy, with which options, under which price.

As WebShop's synthetic goals (`web_agent_site/engine/goal.py`): the instruction of a product that
has one, plus " with <name>: <value>, and <name>: <value>" for the goal options and ", and price
lower than <X> dollars" where X is the larger of two distinct draws from the first four multiples
of $10 above the product's price (no price text and a bound of $1,000,000 when fewer than two such
multiples are below $1,000). Where we differ: WebShop enumerates every option combination of every
product and draws a goal from that list; we draw the product uniformly, then one value per option
name uniformly, so that products with many options are not over-represented. A product whose
attributes entry lists `instruction_options` (a human instruction, which names them already) uses
those options (values the product does not offer are left out) and gets no option text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.webshop.catalog import Catalog, Product

PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))  # WebShop's PRICE_RANGE
NO_PRICE_LIMIT = 1_000_000.0


@dataclass(frozen=True)
class Goal:
    """What the episode asks to buy. `options` maps option name -> wanted value."""

    asin: str
    instruction: str
    attributes: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)
    price_upper: float = NO_PRICE_LIMIT

    def as_info(self) -> dict[str, Any]:
        """The goal as plain JSON-able data, for `info["goal"]`."""
        return {
            "asin": self.asin,
            "instruction": self.instruction,
            "attributes": list(self.attributes),
            "options": dict(self.options),
            "price_upper": self.price_upper,
        }


def price_candidates(price: float) -> list[float]:
    """The multiples of $10 above `price` that a goal's bound is drawn from (up to four)."""
    return [p for p in PRICE_STEPS if p > price][:4]


def make_goal(product: Product, options: Mapping[str, str], price_upper: float) -> Goal:
    """The goal to buy `product` with `options` for at most `price_upper`, its instruction text
    built as in the module docstring. Raises ValueError for options the product does not have."""
    offered = product.option_dict
    for name, value in options.items():
        if value not in offered.get(name, ()):
            raise ValueError(f"{product.asin} has no option {name}: {value}")
    text = product.instruction.rstrip(".") if product.instruction else ""
    if options and product.instruction_options is None:
        text += " with " + ", and ".join(f"{name}: {value}" for name, value in options.items())
    if price_upper < NO_PRICE_LIMIT:
        text += f", and price lower than {price_upper:.2f} dollars"
    return Goal(
        asin=product.asin,
        instruction=text,
        attributes=product.instruction_attributes,
        options=dict(options),
        price_upper=float(price_upper),
    )


def _goal_options(product: Product, rng: np.random.Generator) -> dict[str, str]:
    """The instruction's own options (those the product offers) or one random value per name."""
    if product.instruction_options is not None:
        chosen = {}
        for wanted in product.instruction_options:
            name = next((n for n, values in product.options if wanted in values), None)
            if name is not None and name not in chosen:
                chosen[name] = wanted
        return chosen
    return {name: values[int(rng.integers(len(values)))] for name, values in sorted(product.options)}


def sample_goal(catalog: Catalog, rng: np.random.Generator) -> Goal:
    """A goal drawn from `rng`: a goal product, its options, then its price bound."""
    product = catalog.goal_products[int(rng.integers(len(catalog.goal_products)))]
    options = _goal_options(product, rng)
    candidates = price_candidates(product.price)
    price_upper = NO_PRICE_LIMIT
    if len(candidates) >= 2:
        price_upper = float(max(rng.choice(candidates, size=2, replace=False)))
    return make_goal(product, options, price_upper)
