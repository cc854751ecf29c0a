"""The shop's logic without HTTP: sessions, and a request path -> (status, HTML page).

A session holds what the URL does not: its goal, results per page and, once bought, the
purchase. Many sessions (one per env, or per browser tab) share one shop; their ids are in every
URL (`/s/<sid>/...`). Everything else a page needs (query, result page, options) is in its URL.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import unquote

import numpy as np

from envs.webshop import pages
from envs.webshop.catalog import Catalog, Product
from envs.webshop.goals import NO_PRICE_LIMIT, Goal, make_goal, sample_goal
from envs.webshop.reward import PurchaseReward, purchase_reward
from envs.webshop.search import TOP_K, SearchIndex

MAX_SESSIONS = 10_000
"""Sessions kept at most; beyond it the least recently used is dropped (its next request: 404)."""
SESSION_TTL_S = 3600.0
"""A session idle this long is dropped when the next one starts."""
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ROUTE = re.compile(
    r"/s/(?P<sid>[^/]+)/(?:(?P<search>search)|item/(?P<item>[^/]+)(?:/(?P<sub>description|features))?"
    r"|buy/(?P<buy>[^/]+))?"
)
Query = dict[str, list[str]]


class BadRequestError(ValueError):
    """The request names something that does not exist or is malformed (HTTP 400 / 404)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Session:
    goal: Goal
    per_page: int
    purchase: tuple[str, PurchaseReward] | None = None


def _one(query: Query, key: str, default: str | None = None) -> str:
    values = query.get(key)
    if not values:
        if default is None:
            raise BadRequestError(f"missing {key!r}")
        return default
    return values[0]


def is_small_int(text: str, max_digits: int = 18) -> bool:
    """ASCII digits only, at most `max_digits` of them: what `int(text)` takes cheaply. (str.isdigit
    alone accepts "²", which int() refuses, and int() refuses more than 4,300 digits.)"""
    return text.isascii() and text.isdigit() and len(text) <= max_digits


def _int(query: Query, key: str, default: str, low: int, high: int) -> int:
    text = _one(query, key, default)
    if not is_small_int(text) or not low <= int(text) <= high:
        raise BadRequestError(f"{key} must be an integer in [{low}, {high}], got {text[:40]!r}")
    return int(text)


def _chosen(query: Query, product: Product) -> dict[str, str]:
    """The options in the query (`option:<name>=<value>`), checked against the product's."""
    chosen = {k[len(pages.OPTION_PREFIX) :]: v[0] for k, v in query.items() if k.startswith(pages.OPTION_PREFIX)}
    offered = product.option_dict
    for name, value in chosen.items():
        if value not in offered.get(name, ()):
            raise BadRequestError(f"{product.asin} has no option {name}: {value}")
    return chosen


class Shop:
    """Pages and sessions over one catalog. Thread-safe: the HTTP server calls it from threads."""

    def __init__(self, catalog: Catalog, index: SearchIndex) -> None:
        self.catalog = catalog
        self.index = index
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._last_used: dict[str, float] = {}
        self._lock = threading.Lock()

    def _store(self, sid: str, session: Session) -> None:
        """Add a session (under the lock), expiring those idle for `SESSION_TTL_S` and the least
        recently used beyond `MAX_SESSIONS`: a browser's `GET /` or an env that never called
        `end` must not grow the server's memory without bound."""
        now = time.monotonic()
        self._sessions[sid] = session
        self._sessions.move_to_end(sid)
        self._last_used[sid] = now
        while self._sessions:
            oldest = next(iter(self._sessions))
            if len(self._sessions) <= MAX_SESSIONS and now - self._last_used[oldest] <= SESSION_TTL_S:
                break
            del self._sessions[oldest], self._last_used[oldest]

    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _product(self, asin: str) -> Product:
        product = self.catalog.by_asin.get(unquote(asin))
        if product is None:
            raise BadRequestError(f"no product {asin!r}", 404)
        return product

    def _session(self, sid: str) -> Session:
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None:
                self._sessions.move_to_end(sid)
                self._last_used[sid] = time.monotonic()
        if session is None:
            raise BadRequestError(f"no session {sid!r}", 404)
        return session

    def start_session(self, sid: str, form: Query) -> str:
        """(Re)start session `sid` on the goal in `form` (`asin`, `price_upper`, `per_page`,
        `option:<name>`); returns the search page."""
        if not SESSION_ID.fullmatch(sid):
            raise BadRequestError(f"session id must match {SESSION_ID.pattern}, got {sid!r}")
        product = self._product(_one(form, "asin"))
        if product.instruction is None:
            raise BadRequestError(f"{product.asin} has no instruction, so it cannot be a goal")
        try:
            price_upper = float(_one(form, "price_upper", str(NO_PRICE_LIMIT)))
            if not math.isfinite(price_upper) or price_upper <= 0:
                raise ValueError(f"price_upper must be a number > 0, got {price_upper}")
            goal = make_goal(product, _chosen(form, product), price_upper)
        except ValueError as e:
            raise BadRequestError(str(e)) from None
        per_page = _int(form, "per_page", "10", 1, TOP_K)
        with self._lock:
            self._store(sid, Session(goal, per_page))
        return pages.search_page(sid, goal.instruction)

    def random_session(self, sid: str, seed: int) -> None:
        """Start session `sid` on a goal drawn with `seed` (for a person in a browser)."""
        goal = sample_goal(self.catalog, np.random.default_rng(seed))
        with self._lock:
            self._store(sid, Session(goal, per_page=10))

    def end_session(self, sid: str) -> None:
        with self._lock:
            self._sessions.pop(sid, None)
            self._last_used.pop(sid, None)

    def page(self, path: str, query: Query) -> str:
        """The HTML of GET `path` (with its parsed `query`); raises `BadRequestError`."""
        route = _ROUTE.fullmatch(path)
        if route is None:
            raise BadRequestError(f"no page {path!r}", 404)
        sid = route["sid"]
        session = self._session(sid)
        if route["buy"]:
            return self._buy(session, self._product(route["buy"]), query)
        if route["search"]:
            return self._results(sid, session, query)
        if route["item"]:
            product = self._product(route["item"])
            q, page = _one(query, "q", ""), _int(query, "page", "1", 1, TOP_K)
            chosen = _chosen(query, product)
            if route["sub"]:
                return pages.sub_page(sid, product, q, page, chosen, route["sub"])
            return pages.item_page(sid, product, q, page, chosen)
        return pages.search_page(sid, session.goal.instruction)

    def _results(self, sid: str, session: Session, query: Query) -> str:
        q = _one(query, "q")
        asins = self.index.search(" ".join(q.lower().split()))
        last = max(1, -(-len(asins) // session.per_page))
        page = _int(query, "page", "1", 1, last)
        results = [self.catalog.by_asin[a] for a in asins]
        return pages.results_page(sid, q, page, session.per_page, results)

    def _buy(self, session: Session, product: Product, query: Query) -> str:
        """The purchase page. Only a session's first purchase counts; buying again shows it."""
        chosen = _chosen(query, product)
        with self._lock:
            if session.purchase is None:
                goal_product = self.catalog.by_asin[session.goal.asin]
                reward = purchase_reward(session.goal, goal_product, product, chosen)
                session.purchase = (product.asin, reward)
            asin, reward = session.purchase
        return pages.done_page(asin, reward)
