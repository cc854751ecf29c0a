"""WebShop (Yao et al. 2022) as a text env: a local shop over HTTP, BM25 search, the paper's reward.

The pieces: `catalog` (WebShop's file formats), `goals`, `reward`, `search` (bm25s), `pages` and
`shop` (the HTML site), `server` (127.0.0.1 only), `client` + `page_text` (the env's side),
`expert` (the scripted shopper), `env` (`WebShopEnv`) and `generate_catalog` (the shipped data).

Nothing is imported here, so that `python -m envs.webshop.server` and
`python -m envs.webshop.generate_catalog` run their module once; import from the submodules.
"""
