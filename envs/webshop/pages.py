"""The shop's HTML pages and the URLs between them.

Every page is plain HTML that a browser shows as is and that `envs.webshop.page_text` turns into
the env's observation: a link `<a>` is a clickable `[label]` (WebShop's button names), blocks are
lines. The whole view lives in the URL (query, result page, chosen options), as in WebShop, so the
server keeps per session only the goal and the purchase. `<body data-*>` says which page it is,
for scripted agents and tests; it is not shown. Long text is cut (`clip`) so that a page stays a
few hundred tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from urllib.parse import quote, urlencode

from envs.webshop.catalog import Product
from envs.webshop.reward import PurchaseReward

BACK_TO_SEARCH, NEXT, PREV = "Back to Search", "Next >", "< Prev"
DESCRIPTION, FEATURES, BUY_NOW = "Description", "Features", "Buy Now"
BUTTONS = (BACK_TO_SEARCH, NEXT, PREV, DESCRIPTION, FEATURES, BUY_NOW)
SUB_PAGES = {"description": DESCRIPTION, "features": FEATURES}
OPTION_PREFIX = "option:"
TITLE_CHARS, DESCRIPTION_CHARS, FEATURE_CHARS, NUM_FEATURES = 80, 400, 120, 5
SELECTED = "(selected)"
THANKS = "Thank you for shopping with us!"
SCORE = "Your score (min 0.0, max 1.0):"
# Fixed words of the pages, for a tokenizer's vocabulary (`WebShopEnv.tokenizer_corpus`).
CHROME = (
    "WebShop",
    "Instruction:",
    "Search",
    *BUTTONS,
    "Page",
    "(Total results:",
    ")",
    "No results.",
    "Price:",
    SELECTED,
    THANKS,
    SCORE,
)
_STYLE = "body{font-family:sans-serif;max-width:50em;margin:2em auto}a{margin-right:.6em}"


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending in "..." when cut."""
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def search_url(sid: str, query: str | None = None, page: int = 1) -> str:
    base = f"/s/{sid}/search"
    return base if query is None else f"{base}?{urlencode({'q': query, 'page': page})}"


def home_url(sid: str) -> str:
    return f"/s/{sid}/"


def item_url(sid: str, asin: str, query: str, page: int, chosen: Mapping[str, str], sub_page: str = "") -> str:
    """The item page (or its `sub_page`, "description" / "features") reached from the results
    of `query` page `page`, with options `chosen`."""
    params = [("q", query), ("page", page), *((OPTION_PREFIX + n, v) for n, v in chosen.items())]
    tail = f"/{sub_page}" if sub_page else ""
    return f"/s/{sid}/item/{quote(asin, safe='')}{tail}?{urlencode(params)}"


def buy_url(sid: str, asin: str, chosen: Mapping[str, str]) -> str:
    params = [(OPTION_PREFIX + n, v) for n, v in chosen.items()]
    return f"/s/{sid}/buy/{quote(asin, safe='')}?{urlencode(params)}"


def _link(label: str, href: str, selected: bool = False) -> str:
    mark = ' class="selected"' if selected else ""
    return f'<a href="{escape(href)}"{mark}>{escape(label)}</a>'


def document(kind: str, body: Sequence[str], **data: str) -> str:
    """A whole HTML page; `kind` and `data` become `<body data-*>` attributes."""
    attrs = "".join(f' data-{k.replace("_", "-")}="{escape(str(v))}"' for k, v in data.items())
    lines = "\n".join(body)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>WebShop</title>'
        f'<style>{_STYLE}</style></head>\n<body data-page="{kind}"{attrs}>\n{lines}\n'
        "</body></html>\n"
    )


def search_page(sid: str, instruction: str) -> str:
    return document(
        "search",
        [
            "<h1>WebShop</h1>",
            f'<div id="instruction">Instruction: {escape(instruction)}</div>',
            f'<form action="{search_url(sid)}" method="get"><input name="q" size="40">'
            '<button type="submit">Search</button></form>',
        ],
    )


def results_page(sid: str, query: str, page: int, per_page: int, results: Sequence[Product]) -> str:
    """Page `page` (1-based) of `results`, `per_page` per page."""
    shown = results[(page - 1) * per_page : page * per_page]
    nav = [_link(PREV, search_url(sid, query, page - 1))] if page > 1 else []
    if page * per_page < len(results):
        nav.append(_link(NEXT, search_url(sid, query, page + 1)))
    rows = [
        f"<li>{_link(p.asin, item_url(sid, p.asin, query, page, {}))} "
        f"{escape(clip(p.title, TITLE_CHARS))} {escape(p.price_text)}</li>"
        for p in shown
    ]
    body = [
        f"<div>{_link(BACK_TO_SEARCH, home_url(sid))}</div>",
        f"<div>Page {page} (Total results: {len(results)})</div>",
        f"<div>{' '.join(nav)}</div>" if nav else "",
        f"<ul>{''.join(rows)}</ul>" if rows else "<p>No results.</p>",
    ]
    return document("results", body, page_num=str(page))


def _nav(sid: str, back_href: str) -> str:
    return f"<div>{_link(BACK_TO_SEARCH, home_url(sid))} {_link(PREV, back_href)}</div>"


def item_page(sid: str, product: Product, query: str, page: int, chosen: Mapping[str, str]) -> str:
    """The product with its options (a click selects one) and its buttons; `< Prev` goes back to
    the results page the item was opened from."""
    body = [
        _nav(sid, search_url(sid, query, page)),
        f"<h2>{escape(product.title)}</h2>",
        f"<div>Price: {escape(product.price_text)}</div>",
    ]
    for name, values in product.options:
        links = []
        for value in values:
            href = item_url(sid, product.asin, query, page, {**chosen, name: value})
            selected = chosen.get(name) == value
            links.append(_link(value, href, selected) + (f" {SELECTED}" if selected else ""))
        body.append(f"<div>{escape(name)}: {' '.join(links)}</div>")
    buttons = [_link(label, item_url(sid, product.asin, query, page, chosen, sub)) for sub, label in SUB_PAGES.items()]
    buttons.append(_link(BUY_NOW, buy_url(sid, product.asin, chosen)))
    body.append(f"<div>{' '.join(buttons)}</div>")
    return document("item", body, asin=product.asin)


def sub_page(sid: str, product: Product, query: str, page: int, chosen: Mapping[str, str], which: str) -> str:
    """The product's description or features (first few bullet points), cut short."""
    back = item_url(sid, product.asin, query, page, chosen)
    if which == "description":
        content = f"<p>{escape(clip(product.description, DESCRIPTION_CHARS))}</p>"
    else:
        bullets = product.bullet_points[:NUM_FEATURES]
        content = "<ul>" + "".join(f"<li>{escape(clip(b, FEATURE_CHARS))}</li>" for b in bullets) + "</ul>"
    return document(which, [_nav(sid, back), content], asin=product.asin)


def done_page(asin: str, reward: PurchaseReward) -> str:
    """The end page; `#reward` carries the reward's parts as data attributes for the env."""
    parts = {
        "reward": repr(reward.total),
        "attributes-matched": reward.attributes_matched,
        "num-attributes": reward.num_attributes,
        "options-matched": reward.options_matched,
        "num-options": reward.num_options,
        "price-ok": int(reward.price_ok),
        "type-factor": repr(reward.type_factor),
    }
    attrs = "".join(f' data-{k}="{v}"' for k, v in parts.items())
    return document(
        "done",
        [
            f"<h2>{THANKS}</h2>",
            f'<div id="reward"{attrs}>{SCORE} {reward.total:.2f}</div>',
        ],
        asin=asin,
    )


def error_page(message: str) -> str:
    return document("error", [f"<p>{escape(message)}</p>"])
