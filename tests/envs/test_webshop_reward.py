"""WebShop purchase reward: hand-derived values for each part of r = r_type * matched / total."""

import dataclasses

import pytest

from envs.webshop.catalog import Product
from envs.webshop.goals import Goal
from envs.webshop.reward import purchase_reward, title_score, type_factor

MUG = Product(
    asin="B000000001",
    title="Red Ceramic Coffee Mug",
    price=12.99,
    price_text="$12.99",
    category="kitchen",
    query="coffee mug",
    product_category="Home & Kitchen › Kitchen › Mugs",
    bullet_points=("Holds hot drinks",),
    description="A sturdy cup, microwave safe.",
    options=(("color", ("red", "blue | white")), ("size", ("12 oz", "16 oz"))),
    attributes=("dishwasher safe", "lead free glaze"),
    search_text="",
)
FIVE_WORDS = "Red Ceramic Coffee Mug Set"  # one shared word is a title score of exactly 0.2
ELEVEN_WORDS = "mug alpha bravo charlie delta echo foxtrot golf hotel india juliet"
GOAL = Goal(
    asin=MUG.asin,
    instruction="i need a dishwasher safe, lead free coffee mug",
    attributes=("dishwasher safe", "lead free"),
    options={"color": "red", "size": "12 oz"},
    price_upper=20.0,
)
RIGHT = {"color": "red", "size": "12 oz"}


def other(**fields):
    """Another product (a different asin) with `fields` changed."""
    return dataclasses.replace(MUG, asin="B000000002", **fields)


def test_everything_matched_is_one():
    reward = purchase_reward(GOAL, MUG, MUG, RIGHT)
    assert (reward.attributes_matched, reward.options_matched, reward.price_ok) == (2, 2, True)
    assert (reward.num_attributes, reward.num_options, reward.type_factor) == (2, 2, 1.0)
    assert reward.total == 1.0


@pytest.mark.parametrize(
    ("change", "total"),
    [
        ({"attributes": ("dishwasher safe",)}, 4 / 5),  # one of 2 attributes missing
        ({"attributes": ()}, 3 / 5),  # neither
        ({"price": 20.01}, 4 / 5),  # over budget
        ({"price": 20.0}, 1.0),  # the bound itself is within budget
    ],
)
def test_missing_parts_of_the_goal_product(change, total):
    bought = dataclasses.replace(MUG, **change)  # the goal asin: r_type stays 1
    assert purchase_reward(GOAL, MUG, bought, RIGHT).total == pytest.approx(total)


@pytest.mark.parametrize(
    ("chosen", "total"),
    [
        ({"color": "blue | white", "size": "12 oz"}, 4 / 5),
        ({"size": "12 oz"}, 4 / 5),  # color not chosen
        ({}, 3 / 5),
        ({"color": " RED ", "size": "12  OZ"}, 1.0),  # case and spacing ignored
    ],
)
def test_options(chosen, total):
    assert purchase_reward(GOAL, MUG, MUG, chosen).total == pytest.approx(total)


def test_attribute_found_by_word_subset_or_in_the_text():
    # "lead free" is a word subset of the attribute "lead free glaze"; "microwave safe" is in
    # the description, "hot drinks" in the features, "coffee" in the title.
    goal = dataclasses.replace(
        GOAL, attributes=("lead free", "microwave safe", "hot drinks", "Coffee", "glaze lead", "oven safe")
    )
    reward = purchase_reward(goal, MUG, MUG, RIGHT)
    assert (reward.attributes_matched, reward.num_attributes) == (5, 6)
    assert reward.total == pytest.approx((5 + 2 + 1) / (6 + 2 + 1))


def test_a_goal_without_options():
    goal = dataclasses.replace(GOAL, options={})
    assert purchase_reward(goal, MUG, MUG, {}).total == 1.0
    bought = dataclasses.replace(MUG, attributes=())
    assert purchase_reward(goal, MUG, bought, {}).total == pytest.approx(1 / 3)


def test_title_score_counts_the_goal_titles_content_words():
    # goal words {red, ceramic, coffee, mug} ("a" and "of" are stop words / too short)
    assert title_score("Red Ceramic Coffee Mug", "Blue Coffee Mug") == 0.5
    assert title_score("Red Ceramic Coffee Mug", "Teapot") == 0.0
    assert title_score("a mug of the", "MUG") == 1.0
    assert title_score("12 oz", "12 oz") == 0.0  # no content words at all


@pytest.mark.parametrize(
    ("goal_title", "bought", "factor"),
    [
        (MUG.title, MUG, 1.0),
        (MUG.title, other(title="Steel Teapot"), 0.0),  # no word shared, though same query
        (ELEVEN_WORDS, other(title="Mug"), 0.1),  # 1/11 < 0.1, though same query
        (FIVE_WORDS, other(title="Blue Mug", query="tea", product_category="Kitchen"), 0.5),
        (FIVE_WORDS, other(title="Blue Mug", product_category="Kitchen"), 1.0),  # same query
        (FIVE_WORDS, other(title="Blue Mug", query="tea"), 1.0),  # 3 category levels shared
        (MUG.title, other(title="Blue Mug", query="tea", product_category=""), 1.0),  # 1/4 > 0.2
    ],
)
def test_type_factor(goal_title, bought, factor):
    assert type_factor(dataclasses.replace(MUG, title=goal_title), bought) == factor


def test_another_product_scales_the_reward_by_its_type_factor():
    goal_product = dataclasses.replace(MUG, title=FIVE_WORDS)
    bought = other(title="Blue Mug", query="tea", product_category="Kitchen", price=5.0)
    reward = purchase_reward(GOAL, goal_product, bought, {"color": "red"})
    # dishwasher safe and lead free (subset of "lead free glaze") match, 1 option, price ok
    assert (reward.attributes_matched, reward.options_matched, reward.type_factor) == (2, 1, 0.5)
    assert reward.total == pytest.approx(0.5 * 4 / 5)
