"""The product catalog: loading WebShop's own file formats into `Product` records.

Products file (`products_file`), one of
- a JSON list of products (WebShop's `items_shuffle*.json`), or
- JSON lines `{"id": asin, "contents": search text, "product": {...}}` (WebShop's search
  `documents.jsonl`); `contents` is then the text the search engine indexes.
A product has `asin` and, under either WebShop name: `name`|`Title`, `pricing`|`Price` (a list of
numbers, a number, or text like "$12.99" / "$12.99 to $15.00"), `small_description`|`BulletPoints`
(a list or one string), `full_description`|`Description`, `customization_options`|`options`
(`{name: [value, ...]}` or WebShop's `{name: [{"value": ..., "image": ...}]}`), plus
`category`, `query`, `product_category` ("A › B › C") and `Attributes` (a list), all optional.

Attributes file (`attributes_file`): `{asin: {"attributes": [...], "instruction": "Find me ...",
"instruction_attributes": [...], "instruction_options": [...]}}` (every key optional). A product
with an instruction can be a goal.

As in WebShop's loader: a repeated asin keeps its first product, a missing price is $100.00,
option names and values are lower-cased with "/" written " | ". Where we differ: a price range
costs its lower bound (WebShop draws a price inside the range at start-up), and displayed text is
folded into `roll`'s observation charset (accents stripped, other symbols dropped) so that a real
catalog's unicode fits `TextEnv.observation_space`.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll.agentic.env.base import CHARSET

DATA_DIR = Path(__file__).with_name("data")
DEFAULT_PRODUCTS_FILE = DATA_DIR / "products.json"
DEFAULT_ATTRIBUTES_FILE = DATA_DIR / "attributes.json"
MISSING_PRICE = 100.0  # WebShop's price for a product without one
_ALLOWED = frozenset(CHARSET) - set("\t\r\x0b\x0c")
_PRICE_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


class CatalogError(ValueError):
    """A catalog file is missing or malformed; the message names the file and the problem."""


def clean_text(text: Any) -> str:
    """`text` as one line of charset-safe text: accents folded (é -> e), characters outside
    `CHARSET` dropped, runs of whitespace made one space."""
    folded = unicodedata.normalize("NFKD", str(text))
    kept = "".join(ch if ch in _ALLOWED else " " for ch in folded if not unicodedata.combining(ch))
    return " ".join(kept.split())


@dataclass(frozen=True)
class Product:
    """One product, with display text already cleaned (`clean_text`)."""

    asin: str
    title: str
    price: float
    """What buying it costs: the lower bound of a price range."""
    price_text: str
    """The price as shown: "$12.99" or "$12.99 to $15.00"."""
    category: str
    query: str
    product_category: str
    """The breadcrumb "A › B › C", as in the file (compared, never shown)."""
    bullet_points: tuple[str, ...]
    description: str
    options: tuple[tuple[str, tuple[str, ...]], ...]
    """(name, values) pairs in file order."""
    attributes: tuple[str, ...]
    search_text: str
    instruction: str | None = None
    instruction_attributes: tuple[str, ...] = ()
    instruction_options: tuple[str, ...] | None = None
    """Option values the instruction already asks for (human instructions), else None."""

    @property
    def option_dict(self) -> dict[str, tuple[str, ...]]:
        return dict(self.options)


@dataclass(frozen=True)
class Catalog:
    """The products in file order, by asin, and those that can be goals."""

    products: tuple[Product, ...]
    by_asin: dict[str, Product]
    goal_products: tuple[Product, ...]


def _field(raw: dict[str, Any], *names: str) -> Any:
    """The first of `names` (WebShop's raw name, then its processed alias) that is set."""
    return next((raw[name] for name in names if raw.get(name) is not None), None)


def _parse_prices(value: Any) -> list[float]:
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, bool):
        raise ValueError(f"price {value!r} is not a number")
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list):
        return [p for item in value for p in _parse_prices(item)]
    if isinstance(value, str):
        return [float(m.replace(",", "")) for m in _PRICE_NUMBER.findall(value)]
    raise ValueError(f"price {value!r} is neither a number, a list nor text")


def _price_fields(raw: dict[str, Any]) -> tuple[float, str]:
    prices = _parse_prices(_field(raw, "pricing", "Price"))[:2] or [MISSING_PRICE]
    return prices[0], " to ".join(f"${p:.2f}" for p in prices)


def _text_list(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"{field} must be a list of text, got {type(value).__name__}")
    return tuple(t for t in (clean_text(v) for v in value) if t)


def _option_value(value: Any) -> str:
    if isinstance(value, dict):
        if "value" not in value:
            raise ValueError(f"option entry {value!r} has no 'value'")
        value = value["value"]
    return clean_text(str(value).strip().replace("/", " | ").lower())


def _options(raw: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    found = _field(raw, "customization_options", "options") or {}
    if not isinstance(found, dict):
        raise ValueError(f"customization_options must be an object, got {type(found).__name__}")
    options = []
    for name, values in found.items():
        if values is None:
            continue
        if not isinstance(values, list):
            raise ValueError(f"option {name!r} must be a list, got {type(values).__name__}")
        cleaned = tuple(dict.fromkeys(v for v in map(_option_value, values) if v))
        if cleaned:
            options.append((clean_text(name.lower()), cleaned))
    return tuple(options)


def _product(raw: Any, meta_by_asin: dict[str, dict[str, Any]], contents: str | None) -> Product:
    """A `Product` from one raw record and its attributes-file entry."""
    if not isinstance(raw, dict):
        raise ValueError(f"a product must be an object, got {type(raw).__name__}")
    asin = str(raw.get("asin") or "").strip()
    if not asin:
        raise ValueError("has no asin")
    meta = meta_by_asin.get(asin) or {}
    title = clean_text(_field(raw, "name", "Title") or "")
    price, price_text = _price_fields(raw)
    bullets = _text_list(_field(raw, "small_description", "BulletPoints"), "BulletPoints")
    description = clean_text(_field(raw, "full_description", "Description") or "")
    options = _options(raw)
    search_text = (
        contents
        if contents is not None
        else " ".join([title, *bullets, description, *(v for _, values in options for v in values)])
    )
    instruction = meta.get("instruction")
    given_options = meta.get("instruction_options")
    return Product(
        asin=asin,
        title=title,
        price=price,
        price_text=price_text,
        category=clean_text(raw.get("category") or ""),
        query=clean_text(raw.get("query") or "").lower(),
        product_category=str(raw.get("product_category") or ""),
        bullet_points=bullets,
        description=description,
        options=options,
        attributes=_text_list(_field(raw, "Attributes") or meta.get("attributes"), "attributes"),
        search_text=search_text,
        instruction=clean_text(instruction) if instruction else None,
        instruction_attributes=_text_list(meta.get("instruction_attributes"), "attributes"),
        instruction_options=None
        if given_options is None
        else tuple(map(_option_value, _text_list(given_options, "instruction_options"))),
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CatalogError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None


def _raw_records(path: Path) -> list[tuple[str, Any, str | None]]:
    """(where, product, contents) for every record of a JSON-list or JSON-lines products file."""
    if not path.is_file():
        raise CatalogError(f"{path}: products file not found")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return [(f"product {i}", raw, None) for i, raw in enumerate(_read_json(path))]
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CatalogError(f"{path}: invalid JSON on line {number}: {e.msg}") from None
        if isinstance(record, dict) and isinstance(record.get("product"), dict):
            product = {"asin": record.get("id"), **record["product"]}
            records.append((f"line {number}", product, record.get("contents")))
        else:
            records.append((f"line {number}", record, None))
    return records


def _read_attributes(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None:
        return {}
    if not path.is_file():
        raise CatalogError(f"{path}: attributes file not found")
    data = _read_json(path)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CatalogError(f"{path}: must be a JSON object {{asin: {{...}}}} of objects")
    return data


@functools.cache
def load_catalog(
    products_file: str | None = None,
    attributes_file: str | None = None,
    num_products: int | None = None,
) -> Catalog:
    """The catalog of these files (None, None: the shipped synthetic one), first `num_products`
    products only when given. Cached: envs of one process share one catalog object.
    Raises `CatalogError` naming the file and the problem."""
    if products_file is None and attributes_file is not None:
        raise CatalogError(f"{attributes_file}: an attributes_file needs a products_file")
    attributes_path: Path | None
    if products_file is None:
        products_path, attributes_path = DEFAULT_PRODUCTS_FILE, DEFAULT_ATTRIBUTES_FILE
    else:
        products_path = Path(products_file)
        attributes_path = None if attributes_file is None else Path(attributes_file)
    meta = _read_attributes(attributes_path)
    by_asin: dict[str, Product] = {}
    for where, raw, contents in _raw_records(products_path):
        if num_products is not None and len(by_asin) == num_products:
            break
        try:
            product = _product(raw, meta, contents)
        except ValueError as e:
            raise CatalogError(f"{products_path}: {where}: {e}") from None
        by_asin.setdefault(product.asin, product)
    if not by_asin:
        raise CatalogError(f"{products_path}: has no products")
    products = tuple(by_asin.values())
    goals = tuple(p for p in products if p.instruction)
    if not goals:
        source = attributes_path or products_path
        raise CatalogError(f"{source}: no product has an instruction, so there are no goals")
    return Catalog(products=products, by_asin=by_asin, goal_products=goals)
