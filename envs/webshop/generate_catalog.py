"""Make the shipped synthetic catalog: products and goals in WebShop's own file formats.

    python -m envs.webshop.generate_catalog [--output_dir envs/webshop/data] [--num_products 300]

Deterministic: a fixed seed and sorted JSON, so the command rewrites the shipped files byte for
byte (a test checks it). Each product type has a pool of attributes (what instructions ask for)
and options; a product gets a brand, three or four attributes (two of them in its title), a price
or price range, bullet points and a description made from them. Four products in five get an
instruction ("i am looking for <attribute> and <attribute> <type>") naming one to three of their
attributes, like WebShop's synthetic instructions.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envs.webshop.catalog import DATA_DIR

SEED = 20220704  # WebShop's arXiv date; any fixed number would do
NUM_PRODUCTS = 300
PRODUCTS_NAME, ATTRIBUTES_NAME = "products.json", "attributes.json"
COLORS = ("black", "white", "navy blue", "grey", "red", "green", "beige")


@dataclass(frozen=True)
class ProductType:
    noun: str  # the title's head ("running shoes")
    category: str  # WebShop's top-level category
    breadcrumb: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price_range: tuple[int, int]
    use: str  # "for <use>" in the description


TYPES = (
    ProductType(
        "running shoes",
        "fashion",
        "Clothing, Shoes & Jewelry › Men › Shoes › Athletic",
        ("lightweight", "non slip", "rubber sole", "breathable", "memory foam", "machine washable"),
        (("color", COLORS[:5]), ("size", ("7", "8", "9", "10", "11", "12"))),
        (25, 130),
        "daily runs and long walks",
    ),
    ProductType(
        "t-shirt",
        "fashion",
        "Clothing, Shoes & Jewelry › Women › Clothing › Tops",
        ("cotton", "short sleeve", "machine washable", "slim fit", "moisture wicking", "relaxed fit"),
        (("color", COLORS), ("size", ("small", "medium", "large", "x-large"))),
        (9, 35),
        "everyday wear",
    ),
    ProductType(
        "backpack",
        "fashion",
        "Clothing, Shoes & Jewelry › Luggage › Backpacks",
        ("water resistant", "padded laptop sleeve", "lightweight", "adjustable straps", "large capacity"),
        (("color", COLORS[:4]),),
        (20, 90),
        "school, work and travel",
    ),
    ProductType(
        "shampoo",
        "beauty",
        "Beauty & Personal Care › Hair Care › Shampoo",
        ("sulfate free", "paraben free", "natural ingredients", "for dry hair", "cruelty free", "long lasting"),
        (("size", ("8 fl oz", "16 fl oz", "32 fl oz")), ("scent", ("lavender", "coconut", "unscented", "citrus"))),
        (6, 30),
        "soft and healthy hair",
    ),
    ProductType(
        "face moisturizer",
        "beauty",
        "Beauty & Personal Care › Skin Care › Face",
        ("fragrance free", "for sensitive skin", "hyaluronic acid", "oil free", "cruelty free", "spf 30"),
        (("size", ("1.7 oz", "3.4 oz")),),
        (8, 45),
        "smooth skin all day",
    ),
    ProductType(
        "wireless headphones",
        "electronics",
        "Electronics › Headphones, Earbuds & Accessories › Headphones",
        ("noise cancelling", "bluetooth", "long battery life", "built-in microphone", "over ear", "fast charging"),
        (("color", ("black", "white", "silver", "blue")),),
        (30, 250),
        "music and calls",
    ),
    ProductType(
        "charging cable",
        "electronics",
        "Electronics › Accessories › Cables",
        ("fast charging", "braided", "usb c", "durable", "tangle free"),
        (("length", ("3 ft", "6 ft", "10 ft")), ("color", ("black", "white", "red"))),
        (5, 25),
        "phones, tablets and laptops",
    ),
    ProductType(
        "portable speaker",
        "electronics",
        "Electronics › Portable Audio › Speakers",
        ("waterproof", "bluetooth", "long battery life", "portable", "deep bass"),
        (("color", ("black", "blue", "red", "grey")),),
        (20, 160),
        "parties and trips",
    ),
    ProductType(
        "coffee beans",
        "food",
        "Grocery & Gourmet Food › Beverages › Coffee",
        ("organic", "dark roast", "medium roast", "fair trade", "whole bean", "low acid"),
        (("size", ("12 oz", "2 lb", "5 lb")),),
        (9, 60),
        "a rich morning cup",
    ),
    ProductType(
        "green tea",
        "food",
        "Grocery & Gourmet Food › Beverages › Tea",
        ("organic", "non gmo", "individually wrapped", "gluten free", "sugar free"),
        (("flavor", ("jasmine", "mint", "lemon", "original")), ("size", ("20 count", "50 count", "100 count"))),
        (4, 25),
        "a calm afternoon",
    ),
    ProductType(
        "protein bars",
        "food",
        "Grocery & Gourmet Food › Snacks › Bars",
        ("gluten free", "high protein", "low sugar", "keto friendly", "plant based"),
        (("flavor", ("chocolate", "peanut butter", "vanilla", "lemon")), ("size", ("12 count", "24 count"))),
        (12, 45),
        "snacks on the go",
    ),
    ProductType(
        "office chair",
        "furniture",
        "Home & Kitchen › Furniture › Office Furniture",
        ("ergonomic", "adjustable height", "lumbar support", "easy assembly", "breathable mesh", "swivel"),
        (("color", ("black", "grey", "white", "blue")),),
        (60, 400),
        "long work days",
    ),
    ProductType(
        "bookshelf",
        "furniture",
        "Home & Kitchen › Furniture › Living Room › Bookcases",
        ("solid wood", "easy assembly", "space saving", "sturdy", "wall mounted"),
        (("color", ("walnut", "white", "oak", "black")), ("size", ("3 tier", "5 tier"))),
        (40, 300),
        "books, plants and photos",
    ),
)
BRANDS = (
    "Acorna",
    "Brisko",
    "Calvo",
    "Dunlo",
    "Elmira",
    "Fennix",
    "Gardo",
    "Helio",
    "Istra",
    "Jovano",
    "Kestro",
    "Lumen",
    "Marlo",
    "Norvik",
    "Oskar",
    "Pravo",
    "Quilla",
    "Rennet",
    "Solano",
    "Tavik",
    "Umbra",
    "Velora",
    "Wendal",
    "Xylo",
    "Yarra",
    "Zephir",
)
QUALIFIERS = ("", "for Men", "for Women", "Classic", "Pro", "Plus", "Everyday", "Premium")
OPENERS = ("i am looking for", "i need", "find me", "i want to buy", "please find")
BENEFITS = (
    "made to last",
    "easy to care for",
    "loved by customers",
    "tested for quality",
    "great value for money",
    "backed by a one year warranty",
)
_ASIN_CHARS = np.array(list("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"))


def _pick(rng: np.random.Generator, pool: tuple[str, ...], k: int) -> list[str]:
    """`k` distinct items of `pool`, in the order drawn."""
    return [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]


def _price(rng: np.random.Generator, low: int, high: int) -> str:
    start = int(rng.integers(low, high)) + 0.99
    if rng.random() < 0.2:
        return f"${start:.2f} to ${start + int(rng.integers(2, 15)):.2f}"
    return f"${start:.2f}"


def _options(rng: np.random.Generator, kind: ProductType) -> dict[str, list[dict[str, Any]]]:
    """WebShop's customization_options: a random non-empty subset of each option's values."""
    options = {}
    for name, values in kind.options:
        chosen = sorted(rng.choice(len(values), size=int(rng.integers(2, len(values) + 1)), replace=False))
        options[name] = [{"value": values[i], "image": None} for i in chosen]
    return options


def _product(rng: np.random.Generator, asin: str, kind: ProductType) -> dict[str, Any]:
    brand = BRANDS[int(rng.integers(len(BRANDS)))]
    attributes = _pick(rng, kind.attributes, int(rng.integers(3, 5)))
    qualifier = QUALIFIERS[int(rng.integers(len(QUALIFIERS)))]
    title_words = [brand, *(a.title() for a in attributes[:2]), kind.noun.title(), qualifier]
    benefits = _pick(rng, BENEFITS, 2)
    bullets = [f"{a.capitalize()}: {b}" for a, b in zip(attributes, BENEFITS, strict=False)]
    return {
        "asin": asin,
        "name": " ".join(w for w in title_words if w),
        "pricing": _price(rng, *kind.price_range),
        "category": kind.category,
        "query": kind.noun,
        "product_category": kind.breadcrumb,
        "small_description": [*bullets, f"Made by {brand}, {benefits[0]}"],
        "full_description": (
            f"The {brand} {kind.noun}: {', '.join(attributes[:-1])} and {attributes[-1]}, "
            f"made for {kind.use}. {benefits[1].capitalize()}."
        ),
        "customization_options": _options(rng, kind),
        "Attributes": attributes,
    }


def _instruction(rng: np.random.Generator, product: dict[str, Any]) -> dict[str, Any]:
    wanted = _pick(rng, tuple(product["Attributes"]), int(rng.integers(1, 4)))
    opener = OPENERS[int(rng.integers(len(OPENERS)))]
    return {
        "attributes": product["Attributes"],
        "instruction": f"{opener} {' and '.join(wanted)} {product['query']}",
        "instruction_attributes": wanted,
    }


def generate(num_products: int = NUM_PRODUCTS, seed: int = SEED) -> tuple[list, dict]:
    """(products, attributes by asin), the same for the same arguments."""
    rng = np.random.default_rng(seed)
    asins: set[str] = set()
    products: list[dict[str, Any]] = []
    attributes: dict[str, dict[str, Any]] = {}
    while len(products) < num_products:
        asin = "B0" + "".join(rng.choice(_ASIN_CHARS, size=8))
        if asin in asins:
            continue
        asins.add(asin)
        product = _product(rng, asin, TYPES[len(products) % len(TYPES)])
        products.append(product)
        entry = {"attributes": product["Attributes"]}
        if rng.random() < 0.8:
            entry = _instruction(rng, product)
        attributes[asin] = entry
    order = rng.permutation(len(products))  # shuffled like WebShop's items_shuffle file
    return [products[i] for i in order], attributes


def write_catalog(output_dir: Path, num_products: int = NUM_PRODUCTS) -> tuple[Path, Path]:
    """Write products.json (a JSON list, one product a line) and attributes.json."""
    products, attributes = generate(num_products)
    output_dir.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join(json.dumps(p, sort_keys=True) for p in products)
    products_path = output_dir / PRODUCTS_NAME
    products_path.write_text(f"[\n{lines}\n]\n", encoding="utf-8")
    attributes_path = output_dir / ATTRIBUTES_NAME
    attributes_path.write_text(json.dumps(attributes, sort_keys=True, indent=0) + "\n", encoding="utf-8")
    return products_path, attributes_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m envs.webshop.generate_catalog", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output_dir", type=Path, default=DATA_DIR)
    parser.add_argument("--num_products", type=int, default=NUM_PRODUCTS)
    args = parser.parse_args(argv)
    for path in write_catalog(args.output_dir, args.num_products):
        print(f"{path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
