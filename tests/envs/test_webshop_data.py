"""WebShop data: each products/attributes file variant, clear errors, goals, the shipped catalog."""

import json

import numpy as np
import pytest

from envs.webshop.catalog import (
    DEFAULT_ATTRIBUTES_FILE,
    DEFAULT_PRODUCTS_FILE,
    CatalogError,
    clean_text,
    load_catalog,
)
from envs.webshop.generate_catalog import write_catalog
from envs.webshop.goals import NO_PRICE_LIMIT, make_goal, price_candidates, sample_goal

# A product as in WebShop's raw items file.
RAW = {
    "asin": "B000000001",
    "name": "Red Ceramic Coffee Mug",
    "pricing": "$12.99 to $15.00",
    "query": "Coffee Mug ",
    "category": "kitchen",
    "product_category": "Home & Kitchen › Kitchen › Mugs",
    "small_description": "Dishwasher safe",
    "full_description": "A sturdy cup.",
    "customization_options": {
        "Color": [{"value": "Red", "image": None}, {"value": "Blue/White", "image": "x.jpg"}],
        "Pattern": None,
    },
}
# The same kind of product with WebShop's processed field names.
PROCESSED = {
    "asin": "B000000002",
    "Title": "Blue Tea Cup",
    "Price": "$8.50",
    "BulletPoints": ["Fine china", "Hand wash"],
    "Description": "For tea.",
    "options": {"size": ["Small", "Large"]},
    "Attributes": ["fine china"],
}
META = {
    "B000000001": {
        "attributes": ["dishwasher safe"],
        "instruction": "i need a dishwasher safe coffee mug.",
        "instruction_attributes": ["dishwasher safe"],
    },
    "B000000002": {"instruction": "a small cup", "instruction_options": ["Small", "purple"]},
}


def write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def write_lines(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


@pytest.fixture
def files(tmp_path):
    return write(tmp_path / "p.json", [RAW, PROCESSED]), write(tmp_path / "a.json", META)


def test_json_list_with_raw_and_processed_field_names(files):
    catalog = load_catalog(*files)
    raw, processed = catalog.products
    assert (raw.asin, raw.title, raw.price, raw.price_text) == (
        "B000000001",
        "Red Ceramic Coffee Mug",
        12.99,
        "$12.99 to $15.00",
    )
    assert (raw.query, raw.category, raw.product_category) == (
        "coffee mug",
        "kitchen",
        "Home & Kitchen › Kitchen › Mugs",
    )
    assert raw.bullet_points == ("Dishwasher safe",) and raw.description == "A sturdy cup."
    assert raw.options == (("color", ("red", "blue | white")),)  # None options are skipped
    assert raw.attributes == ("dishwasher safe",)  # from the attributes file
    assert raw.instruction == "i need a dishwasher safe coffee mug."
    assert raw.instruction_attributes == ("dishwasher safe",) and raw.instruction_options is None
    assert raw.search_text == ("Red Ceramic Coffee Mug Dishwasher safe A sturdy cup. red blue | white")
    assert (processed.title, processed.price, processed.price_text) == ("Blue Tea Cup", 8.5, "$8.50")
    assert processed.bullet_points == ("Fine china", "Hand wash")
    assert processed.options == (("size", ("small", "large")),)
    assert processed.attributes == ("fine china",)  # the product's own Attributes
    assert processed.instruction_options == ("small", "purple")
    assert catalog.goal_products == catalog.products
    assert catalog.by_asin["B000000002"] is processed


@pytest.mark.parametrize(
    ("pricing", "price", "text"),
    [
        ([10, 20.5, 30], 10.0, "$10.00 to $20.50"),
        (7, 7.0, "$7.00"),
        ("$1,299", 1299.0, "$1299.00"),
        ("$3.50$4.00", 3.5, "$3.50 to $4.00"),
        (None, 100.0, "$100.00"),
        ("", 100.0, "$100.00"),
    ],
)
def test_price_forms(tmp_path, pricing, price, text):
    product = {**RAW, "pricing": pricing}
    catalog = load_catalog(write(tmp_path / "p.json", [product]), write(tmp_path / "a.json", META))
    assert (catalog.products[0].price, catalog.products[0].price_text) == (price, text)


def test_jsonl_search_documents(tmp_path):
    records = [
        {"id": "B000000001", "contents": "red mug text", "product": {k: v for k, v in RAW.items() if k != "asin"}},
        {"id": "B000000002", "contents": "blue cup text", "product": PROCESSED},
    ]
    catalog = load_catalog(write_lines(tmp_path / "d.jsonl", records), write(tmp_path / "a.json", META))
    assert [p.asin for p in catalog.products] == ["B000000001", "B000000002"]
    assert [p.search_text for p in catalog.products] == ["red mug text", "blue cup text"]
    assert catalog.products[0].title == "Red Ceramic Coffee Mug"


def test_jsonl_of_plain_products_dedupe_and_cap(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [RAW, {**RAW, "name": "Copy"}, PROCESSED])
    catalog = load_catalog(path, write(tmp_path / "a.json", META))
    assert [p.title for p in catalog.products] == ["Red Ceramic Coffee Mug", "Blue Tea Cup"]
    capped = load_catalog(path, write(tmp_path / "a.json", META), num_products=1)
    assert [p.asin for p in capped.products] == ["B000000001"]


def test_clean_text_folds_into_the_observation_charset():
    assert clean_text("Café  ☕ Crème\t“Deluxe”\n") == "Cafe Creme “Deluxe”"
    assert clean_text(None) == "None"


MISSING = object()  # a path to a file that does not exist


@pytest.mark.parametrize(
    ("products", "attributes", "problem"),
    [
        (MISSING, None, "p.json: products file not found"),
        ([RAW], MISSING, "a.json: attributes file not found"),
        ("[{]", None, "p.json: invalid JSON at line 1: "),
        ([{"name": "x"}], {}, "p.json: product 0: has no asin"),
        ([RAW, [1]], {}, "p.json: product 1: a product must be an object, got list"),
        (
            [{**RAW, "customization_options": ["red"]}],
            {},
            "p.json: product 0: customization_options must be an object, got list",
        ),
        ([{**RAW, "pricing": True}], {}, "p.json: product 0: price True is not a number"),
        ([RAW], {"B000000001": ["x"]}, "a.json: must be a JSON object {asin: {...}} of objects"),
        ([RAW], {}, "a.json: no product has an instruction, so there are no goals"),
        ([], {}, "p.json: has no products"),
    ],
)
def test_bad_files_name_the_file_and_the_problem(tmp_path, products, attributes, problem):
    def place(name, content):
        path = tmp_path / name
        if content is not MISSING:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        return str(path)

    attributes_file = None if attributes is None else place("a.json", attributes)
    with pytest.raises(CatalogError) as err:
        load_catalog(place("p.json", products), attributes_file)
    assert str(err.value).startswith(str(tmp_path)) and problem in str(err.value)
    assert "\n" not in str(err.value)


def test_jsonl_error_names_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(RAW) + "\n\n{oops\n")
    with pytest.raises(CatalogError, match=r"p\.jsonl: invalid JSON on line 3: "):
        load_catalog(str(path), None)


def test_attributes_file_needs_a_products_file():
    with pytest.raises(CatalogError, match=r"^a\.json: an attributes_file needs a products_file$"):
        load_catalog(None, "a.json")


def test_make_goal_instruction_text(files):
    mug, cup = load_catalog(*files).products
    goal = make_goal(mug, {"color": "blue | white"}, 30.0)
    assert goal.instruction == (
        "i need a dishwasher safe coffee mug with color: blue | white, and price lower than 30.00 dollars"
    )
    assert goal.as_info() == {
        "asin": "B000000001",
        "instruction": goal.instruction,
        "attributes": ["dishwasher safe"],
        "options": {"color": "blue | white"},
        "price_upper": 30.0,
    }
    # a human instruction names its options already; no price text without a bound
    assert make_goal(cup, {"size": "small"}, NO_PRICE_LIMIT).instruction == "a small cup"
    with pytest.raises(ValueError, match="B000000001 has no option color: green"):
        make_goal(mug, {"color": "green"}, 30.0)


def test_price_candidates_are_the_next_four_tens():
    assert price_candidates(12.99) == [20.0, 30.0, 40.0, 50.0]
    assert price_candidates(20.0) == [30.0, 40.0, 50.0, 60.0]
    assert price_candidates(975.0) == [980.0, 990.0]
    assert price_candidates(985.0) == [990.0]


def test_sample_goal_draws_options_and_the_larger_of_two_prices(files):
    catalog = load_catalog(*files)
    goals = [sample_goal(catalog, np.random.default_rng(seed)) for seed in range(200)]
    mug_goals = [g for g in goals if g.asin == "B000000001"]
    cup_goals = [g for g in goals if g.asin == "B000000002"]
    assert mug_goals and cup_goals
    assert {g.options["color"] for g in mug_goals} == {"red", "blue | white"}
    assert {g.price_upper for g in mug_goals} == {30.0, 40.0, 50.0}  # max of 2 of [20..50]
    assert {g.price_upper for g in cup_goals} == {20.0, 30.0, 40.0}  # 8.50: [10, 20, 30, 40]
    # the human instruction's options, "purple" not offered so left out
    assert all(g.options == {"size": "small"} for g in cup_goals)
    again = [sample_goal(catalog, np.random.default_rng(seed)) for seed in range(200)]
    assert again == goals


def test_goal_without_affordable_bound(tmp_path):
    catalog = load_catalog(write(tmp_path / "p.json", [{**RAW, "pricing": "$985"}]), write(tmp_path / "a.json", META))
    goal = sample_goal(catalog, np.random.default_rng(0))
    assert goal.price_upper == NO_PRICE_LIMIT and "price lower than" not in goal.instruction


def test_generator_rewrites_the_shipped_catalog_byte_for_byte(tmp_path):
    products, attributes = write_catalog(tmp_path)
    assert products.read_bytes() == DEFAULT_PRODUCTS_FILE.read_bytes()
    assert attributes.read_bytes() == DEFAULT_ATTRIBUTES_FILE.read_bytes()
    assert DEFAULT_PRODUCTS_FILE.stat().st_size + DEFAULT_ATTRIBUTES_FILE.stat().st_size < 500_000


def test_shipped_catalog():
    catalog = load_catalog()
    assert len(catalog.products) == 300 and len(catalog.by_asin) == 300
    assert 200 < len(catalog.goal_products) < 280  # four in five have an instruction
    for product in catalog.goal_products:
        assert set(product.instruction_attributes) <= set(product.attributes)
        values = [v for _, vs in product.options for v in vs]
        assert len(values) == len(set(values))  # option values are distinct clickables
