"""WebShopEnv through its real server: exact pages, clicks, purchases, invalid actions, seeds."""

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  registers the built-ins (the entry point may not be installed)
from envs.webshop import server as server_module
from envs.webshop.catalog import CatalogError
from envs.webshop.env import ACTION_FORMAT, TASK, WebShopEnv

GOAL_ASIN = "B000000001"
MUG = {
    "asin": GOAL_ASIN,
    "name": "Red Ceramic Coffee Mug",
    "pricing": "$12.99",
    "query": "coffee mug",
    "product_category": "Home & Kitchen › Kitchen › Mugs",
    "small_description": ["Dishwasher safe", "Holds hot drinks"],
    "full_description": "A sturdy cup for coffee and tea.",
    "customization_options": {
        "color": [{"value": "Red", "image": None}, {"value": "Blue/White", "image": None}],
        "size": [{"value": "12 oz", "image": None}, {"value": "16 oz", "image": None}],
    },
}
# 24 identical plain mugs: equal BM25 scores, so they keep catalog order; the goal mug's longer
# text ranks it last for "mug".
PLAIN = [{"asin": f"B0000000{i:02d}", "name": "Plain Mug", "pricing": "$5.00", "query": "mug"} for i in range(2, 26)]
ATTRIBUTES = {
    GOAL_ASIN: {
        "attributes": ["dishwasher safe"],
        "instruction": "i need a dishwasher safe coffee mug",
        "instruction_attributes": ["dishwasher safe"],
    }
}
# Seed 0 draws color "blue | white", size "16 oz", price bound 50 (checked below).
INSTRUCTION = (
    "i need a dishwasher safe coffee mug with color: blue | white, and size: 16 oz, and price lower than 50.00 dollars"
)
SEARCH_PAGE = f"WebShop\nInstruction: {INSTRUCTION}\n[Search]"
ITEM_PAGE = (
    "[Back to Search] [< Prev]\nRed Ceramic Coffee Mug\nPrice: $12.99\n"
    "color: [red] [blue | white]\nsize: [12 oz] [16 oz]\n[Description] [Features] [Buy Now]"
)


def plain_rows(first, last):
    return "".join(f"\n[B0000000{i:02d}] Plain Mug $5.00" for i in range(first, last + 1))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shop")
    (folder / "products.json").write_text(json.dumps([MUG, *PLAIN]))
    (folder / "attributes.json").write_text(json.dumps(ATTRIBUTES))
    return {"products_file": str(folder / "products.json"), "attributes_file": str(folder / "attributes.json")}


@pytest.fixture
def env(files):
    env = WebShopEnv(**files)
    yield env
    env.close()


def act(env, action):
    return env.step(f"<answer>{action}</answer>")


def play(env, actions):
    for action in actions:
        obs, reward, terminated, truncated, info = act(env, action)
        assert info["action_is_valid"], action
    return obs, reward, terminated, truncated, info


def test_reset_shows_the_search_page_and_the_goal(env):
    obs, info = env.reset(seed=0)
    assert obs == SEARCH_PAGE
    assert info == {
        "env_instruction": f"{TASK}\nInstruction: {INSTRUCTION}\n{ACTION_FORMAT}",
        "metrics": {},
        "goal": {
            "asin": GOAL_ASIN,
            "instruction": INSTRUCTION,
            "attributes": ["dishwasher safe"],
            "options": {"color": "blue | white", "size": "16 oz"},
            "price_upper": 50.0,
        },
    }


def test_pagination_prev_next_and_back_to_search(env):
    env.reset(seed=0)
    page1 = "[Back to Search]\nPage 1 (Total results: 25)\n[Next >]" + plain_rows(2, 11)
    page2 = "[Back to Search]\nPage 2 (Total results: 25)\n[< Prev] [Next >]" + plain_rows(12, 21)
    page3 = (
        "[Back to Search]\nPage 3 (Total results: 25)\n[< Prev]"
        + plain_rows(22, 25)
        + f"\n[{GOAL_ASIN}] Red Ceramic Coffee Mug $12.99"
    )
    assert act(env, "search[ MUG ]")[:4] == (page1, 0.0, False, False)
    assert act(env, "click[Next >]")[0] == page2
    assert act(env, "click[  next   > ]")[0] == page3  # case and spaces do not matter
    assert act(env, "click[< Prev]")[0] == page2
    assert act(env, "click[back to search]")[0] == SEARCH_PAGE
    assert act(env, "search[ceramic]")[0] == (
        f"[Back to Search]\nPage 1 (Total results: 1)\n[{GOAL_ASIN}] Red Ceramic Coffee Mug $12.99"
    )
    assert act(env, "click[Back to Search]")[0] == SEARCH_PAGE
    assert act(env, "search[teapot]")[0] == ("[Back to Search]\nPage 1 (Total results: 0)\nNo results.")


def test_item_options_and_sub_pages(env):
    env.reset(seed=0)
    assert play(env, ["search[ceramic]", f"click[{GOAL_ASIN.lower()}]"])[0] == ITEM_PAGE
    selected = ITEM_PAGE.replace("[blue | white]", "[blue | white] (selected)")
    assert act(env, "click[Blue | White]")[0] == selected
    assert act(env, "click[red]")[0] == ITEM_PAGE.replace("[red]", "[red] (selected)")
    both = ITEM_PAGE.replace("[red]", "[red] (selected)").replace("[16 oz]", "[16 oz] (selected)")
    assert act(env, "click[16 oz]")[0] == both
    assert act(env, "click[Description]")[0] == ("[Back to Search] [< Prev]\nA sturdy cup for coffee and tea.")
    assert act(env, "click[< Prev]")[0] == both  # the chosen options are kept
    assert act(env, "click[Features]")[0] == ("[Back to Search] [< Prev]\nDishwasher safe\nHolds hot drinks")
    assert act(env, "click[< Prev]")[0] == both
    assert act(env, "click[< Prev]")[0].startswith("[Back to Search]\nPage 1 (Total results: 1)")


def test_mark_asked_options_follows_the_asked_values_on_product_pages_only(files):
    env = WebShopEnv(**files, mark_asked_options=True)
    try:
        assert env.reset(seed=0)[0] == SEARCH_PAGE  # asks for blue | white, 16 oz
        assert not act(env, "search[ceramic]")[0].count("(asked)")
        marked = ITEM_PAGE.replace("[blue | white]", "[blue | white] (asked)").replace("[16 oz]", "[16 oz] (asked)")
        assert act(env, f"click[{GOAL_ASIN}]")[0] == marked
        assert act(env, "click[red]")[0] == marked.replace("[red]", "[red] (selected)")
        chosen = act(env, "click[16 oz]")[0]
        assert "size: [12 oz] [16 oz] (asked) (selected)" in chosen.split("\n")
        assert not act(env, "click[Description]")[0].count("(asked)")
        assert "(asked)" in env.tokenizer_corpus() and "(asked)" not in WebShopEnv(**files).tokenizer_corpus()
    finally:
        env.close()
    with pytest.raises(ValueError, match="mark_asked_options must be true or false, got 'yes'"):
        WebShopEnv(**files, mark_asked_options="yes")


def test_the_shopper_teacher_opens_a_listed_product_chooses_the_asked_options_and_buys(env):
    rng = np.random.default_rng(0)
    env.reset(seed=0)  # asks for blue | white, 16 oz
    assert env.sample_shopper_action(rng).startswith("<answer>search[")
    act(env, "search[ceramic]")  # one result: the goal mug
    answers = []
    while (answer := env.sample_shopper_action(rng)) is not None:
        answers.append(answer)
        reward = env.step(answer)[1]
    clicks = [f"<answer>click[{label}]</answer>" for label in (GOAL_ASIN, "blue | white", "16 oz", "Buy Now")]
    assert answers == clicks and reward == 1.0
    env.reset(seed=0)
    play(env, ["search[ceramic]", f"click[{GOAL_ASIN}]", "click[Description]"])
    assert env.sample_shopper_action(rng) == "<answer>click[< Prev]</answer>"


@pytest.mark.parametrize(
    ("clicks", "reward", "metrics"),
    [
        (["blue | white", "16 oz"], 1.0, (1.0, 1.0, 1.0, 1.0)),
        (["red", "16 oz"], 0.75, (1.0, 0.5, 1.0, 1.0)),  # (1 + 1 + 1) / (1 + 2 + 1)
        ([], 0.5, (1.0, 0.0, 1.0, 1.0)),  # (1 + 0 + 1) / 4
        (["Description", "< Prev"], 0.5, (1.0, 0.0, 1.0, 1.0)),  # clicks on the item page, no option
    ],
)
def test_buy_now_ends_the_episode_with_the_paper_reward(env, clicks, reward, metrics):
    env.reset(seed=0)
    play(env, ["search[ceramic]", f"click[{GOAL_ASIN}]", *(f"click[{c}]" for c in clicks)])
    obs, got, terminated, truncated, info = act(env, "click[Buy Now]")
    assert obs == f"Thank you for shopping with us!\nYour score (min 0.0, max 1.0): {reward:.2f}"
    assert (got, terminated, truncated, info["success"]) == (reward, True, False, reward == 1.0)
    attributes, options, price, kind = metrics
    assert info["metrics"] == {
        "num_actions": 3.0 + len(clicks),
        "num_invalid": 0.0,
        "purchased": 1.0,
        "score": reward,
        "reward_attributes": attributes,
        "reward_options": options,
        "reward_price": price,
        "reward_type": kind,
        "num_searches": 1.0,
        "chose_option": float(reward > 0.5),  # an option was selected (the clicks before Buy Now)
    }
    # after the purchase a well-formed action changes nothing and pays nothing
    assert act(env, "search[anything]")[:4] == (obs, 0.0, True, False)


def test_buying_another_product(env):
    env.reset(seed=0)
    play(env, ["search[mug]", "click[B000000002]"])
    _, reward, terminated, _, info = act(env, "click[Buy Now]")
    # no attribute, no option, price ok; title score 1/4 ("mug") > 0.2: type factor 1
    assert (reward, terminated, info["success"]) == (0.25, True, False)
    assert info["metrics"]["reward_type"] == 1.0 and info["metrics"]["reward_attributes"] == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        "<answer>click[Buy Now]</answer>",  # no such button on the search page
        "<answer>click[B000000002]</answer>",  # not on this page
        "<answer>search[]</answer>",
        "<answer>buy[mug]</answer>",
        "click[Next >]",  # no answer block
        "<answer>search[mug] please</answer>",
        "",
    ],
)
def test_invalid_actions_change_nothing(env, answer):
    obs, _ = env.reset(seed=0)
    assert env.step(answer)[:4] == (obs, -0.1, False, False)
    act(env, "search[mug]")
    results = act(env, "click[Next >]")[0]
    # no search box on a results page; an item id from another page
    for text in ("<answer>search[mug]</answer>", "<answer>click[B000000002]</answer>", answer):
        obs, reward, terminated, truncated, info = env.step(text)
        assert (obs, reward, terminated, truncated) == (results, -0.1, False, False)
        assert info["action_is_valid"] is False
    assert info["metrics"]["num_invalid"] == 4.0 and info["metrics"]["num_searches"] == 1.0


def test_max_steps_truncates_after_that_many_valid_actions(files):
    env = WebShopEnv(**files, max_steps=3, format_penalty=-0.5)
    env.reset(seed=0)
    assert act(env, "click[Nope]")[1:4] == (-0.5, False, False)  # invalid: not counted
    assert act(env, "search[mug]")[2:4] == (False, False)
    assert act(env, "click[Next >]")[2:4] == (False, False)
    assert act(env, "click[Next >]")[1:4] == (0.0, False, True)
    env.close()


def test_results_per_page(files):
    env = WebShopEnv(**files, results_per_page=20)
    env.reset(seed=0)
    obs = act(env, "search[mug]")[0]
    assert obs == "[Back to Search]\nPage 1 (Total results: 25)\n[Next >]" + plain_rows(2, 21)
    env.close()


def scripted_episode(env, seed):
    obs, info = env.reset(seed=seed)
    steps = [(obs, info["goal"])]
    for _ in range(env.max_steps):
        obs, reward, terminated, truncated, info = env.step(env.scripted_action())
        steps.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return steps


def test_same_seed_same_goal_and_pages():
    first, second = WebShopEnv(), WebShopEnv()
    for seed in (0, 7):
        assert scripted_episode(first, seed) == scripted_episode(second, seed)
    goals = {json.dumps(scripted_episode(first, seed)[0][1]) for seed in range(5)}
    assert len(goals) == 5
    first.close()
    second.close()


def test_scripted_agent_buys_the_goal_on_every_seed():
    env = WebShopEnv()
    for seed in range(40):
        steps = scripted_episode(env, seed)
        *_, info = steps[-1]
        assert info["success"] and steps[-1][1] == 1.0, seed
        for obs, *_ in steps:
            assert env.observation_space.contains(obs)
    assert env.scripted_action() is None  # nothing left to do after the purchase
    env.close()


def test_scripted_agent_falls_back_to_the_title(files):
    env = WebShopEnv(**files, results_per_page=2)  # the goal is on page 13 of "mug" results
    env.reset(seed=0)
    play(env, ["search[mug]"])
    actions = []
    while not env.success:
        actions.append(env.scripted_action())
        env.step(actions[-1])
    assert actions == [
        "<answer>click[Next >]</answer>",
        "<answer>click[Next >]</answer>",
        "<answer>click[Back to Search]</answer>",
        "<answer>search[Red Ceramic Coffee Mug]</answer>",
        f"<answer>click[{GOAL_ASIN}]</answer>",
        "<answer>click[blue | white]</answer>",
        "<answer>click[16 oz]</answer>",
        "<answer>click[Buy Now]</answer>",
    ]
    env.close()


def test_check_env_passes():
    env = gym.make("roll/WebShop-v0").unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    env.close()


def test_close_releases_the_shared_server(files):
    key_files = {**files, "num_products": 24}  # a catalog key no other env holds
    env = WebShopEnv(**key_files)
    env.reset(seed=0)
    key = env._catalog_key
    assert server_module._shared[key][1] == 1
    env.close()
    assert key not in server_module._shared
    assert env.reset(seed=0)[0] == SEARCH_PAGE  # a new episode starts the server again
    env.close()


def test_missing_catalog_file_is_a_clear_error(tmp_path):
    with pytest.raises(CatalogError, match=r"nothing\.json: products file not found$"):
        WebShopEnv(products_file=str(tmp_path / "nothing.json"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_steps": 0}, "max_steps must be an integer >= 1, got 0"),
        ({"results_per_page": 51}, r"results_per_page must be an integer in \[1, 50\], got 51"),
        ({"num_products": True}, "num_products must be an integer >= 1, got True"),
        ({"request_retries": -1}, "request_retries must be an integer >= 0, got -1"),
        ({"request_timeout_s": 0}, "request_timeout_s must be a number > 0, got 0"),
        ({"render_mode": "human"}, "render_mode 'human' not in"),
    ],
)
def test_bad_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WebShopEnv(**kwargs)


def test_reset_takes_no_options(env):
    with pytest.raises(ValueError, match=r"WebShopEnv.reset takes no options, got \['asin'\]"):
        env.reset(seed=0, options={"asin": GOAL_ASIN})


def test_search_queries_are_folded_into_the_charset(env):
    env.reset(seed=0)
    assert act(env, "search[☕]")[4]["action_is_valid"] is False  # nothing left to search for
    obs, _, _, _, info = act(env, "search[Cerámic\udc80 ☕]")  # a lone surrogate, an accent
    assert info["action_is_valid"] and obs.endswith(f"[{GOAL_ASIN}] Red Ceramic Coffee Mug $12.99")


def test_fuzzed_actions_raise_nothing(env):
    rng = np.random.default_rng(0)
    pieces = [
        "<answer>",
        "</answer>",
        "search[",
        "click[",
        "]",
        "[",
        "mug",
        "Next >",
        "Buy Now",
        GOAL_ASIN,
        "red",
        "\udc80",
        "\x00",
        "%",
        "/",
        " ",
        "\n",
        "é",
    ]
    env.reset(seed=0)
    for i in range(500):
        text = "".join(rng.choice(pieces, size=int(rng.integers(0, 8))))
        obs, _, terminated, truncated, _ = env.step(text)
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            env.reset(seed=i)


def test_sample_valid_action_is_always_accepted_and_spans_the_page(env):
    """The format teacher's action: a 2-5 word span of the instruction on the search page, a click
    on one of the page's labels elsewhere; always valid, and the env's state is untouched."""
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    queries = {env.sample_valid_action(rng) for _ in range(200)}
    words = INSTRUCTION.split()
    for query in queries:
        inner = query.removeprefix("<answer>search[").removesuffix("]</answer>").split()
        assert 2 <= len(inner) <= 5 and any(words[i : i + len(inner)] == inner for i in range(len(words)))
    assert len(queries) > 20
    play(env, ["search[ceramic]", f"click[{GOAL_ASIN}]"])
    clicks = {env.sample_valid_action(rng) for _ in range(300)}
    assert clicks == {
        f"<answer>click[{label}]</answer>"
        for label in (
            "Back to Search",
            "< Prev",
            "red",
            "blue | white",
            "12 oz",
            "16 oz",
            "Description",
            "Features",
            "Buy Now",
        )
    }
    for answer in sorted(clicks):  # each one is a valid action of that page
        env.reset(seed=0)
        play(env, ["search[ceramic]", f"click[{GOAL_ASIN}]"])
        assert env.step(answer)[4]["action_is_valid"], answer
    act(env, "click[Buy Now]")
    assert env.sample_valid_action(rng) is None  # nothing is left to do once bought
