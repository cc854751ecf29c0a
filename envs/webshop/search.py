"""Product search: BM25 over each product's search text, with the `bm25s` package.

WebShop ranks with Lucene BM25 through pyserini (Java); `bm25s` implements the same Lucene
variant in numpy, so a pip install is enough. Its own regex tokenizer and English stop words are
used, without a stemmer (nothing to download). Like WebShop, a search returns at most the top 50
products; unlike it, products that share no word with the query are left out (an empty page says
"no results" rather than listing arbitrary products), and ties keep catalog order.
"""

from __future__ import annotations

import functools

import bm25s
import numpy as np

from envs.webshop.catalog import Catalog

TOP_K = 50  # most results of one search, as in WebShop


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class SearchIndex:
    """A BM25 index of a catalog's products. `search` is cached and safe to call from threads."""

    def __init__(self, catalog: Catalog) -> None:
        self._asins = [p.asin for p in catalog.products]
        self._bm25 = bm25s.BM25()
        self._bm25.index(_tokens([p.search_text for p in catalog.products]), show_progress=False)
        self.search = functools.lru_cache(maxsize=4096)(self._search)

    def _search(self, query: str) -> tuple[str, ...]:
        """Asins of the best `TOP_K` products for `query`, best first."""
        tokens = _tokens([query])[0]
        if not tokens:
            return ()
        scores = self._bm25.get_scores(tokens)
        order = np.argsort(-scores, kind="stable")[:TOP_K]
        return tuple(self._asins[i] for i in order if scores[i] > 0)
