"""The shop's HTTP server (stdlib `ThreadingHTTPServer`), always bound to 127.0.0.1.

One server per process and catalog is shared by every env of that process (`acquire_server` /
`release_server`, refcounted): it starts with the first env and stops with the last `close()`, or
at exit. For a person in a browser:

    python -m envs.webshop.server --port 8000    # then open http://127.0.0.1:8000/

Endpoints: `GET /health` (JSON), `GET /` (a new session on a random goal, redirected to its
search page), `POST /s/<sid>/start` and `/s/<sid>/end` (an env's session), and the pages of
`envs.webshop.shop` under `/s/<sid>/`.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from envs.webshop import pages
from envs.webshop.catalog import CatalogError, load_catalog
from envs.webshop.search import SearchIndex
from envs.webshop.shop import BadRequestError, Shop, is_small_int

HOST = "127.0.0.1"  # never another interface: the shop has no authentication
MAX_BODY_BYTES = 65536
READ_TIMEOUT_S = 30.0  # see _Handler.timeout
_browser_sessions = itertools.count()


class ServerStartError(RuntimeError):
    """The shop server could not start (the message says why in one line)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: an env reuses one connection
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's
    # delayed ACK (about 40 ms a page).
    disable_nagle_algorithm = True
    # Socket reads time out: a client that sends a short body (or goes quiet mid-request) frees its
    # thread after this long instead of holding it forever. An idle keep-alive connection is
    # closed too; the env's client reconnects on its next request (envs/webshop/client.py).
    timeout = READ_TIMEOUT_S
    server: _ShopHTTPServer

    def _send(self, status: int, body: str, content_type: str = "text/html", location: str | None = None) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, page: Callable[[], str]) -> None:
        """Send `page()`'s HTML, or an error page for a `BadRequestError`."""
        try:
            self._send(200, page())
        except BadRequestError as e:
            self._send(e.status, pages.error_page(str(e)))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        shop = self.server.shop
        if url.path == "/health":
            health = {"status": "ok", "products": len(shop.catalog.products)}
            self._send(200, json.dumps(health), "application/json")
        elif url.path == "/":
            query = parse_qs(url.query)
            number = next(_browser_sessions)
            seed = int(query["seed"][0]) if is_small_int(query.get("seed", [""])[0]) else number
            sid = f"web-{number}"
            shop.random_session(sid, seed)
            self._send(303, "", location=pages.home_url(sid))
        else:
            self._answer(lambda: shop.page(url.path, parse_qs(url.query)))

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length") or "0"
        if not is_small_int(length) or int(length) > MAX_BODY_BYTES:
            self._send(413, pages.error_page("Bad request."))
            self.close_connection = True
            return
        form = parse_qs(self.rfile.read(int(length)).decode("utf-8", errors="replace"))
        parts = urlsplit(self.path).path.strip("/").split("/")
        shop = self.server.shop
        if len(parts) == 3 and parts[0] == "s" and parts[2] == "start":
            self._answer(lambda: shop.start_session(parts[1], form))
        elif len(parts) == 3 and parts[0] == "s" and parts[2] == "end":
            shop.end_session(parts[1])
            self._send(200, "")
        else:
            self._send(404, pages.error_page("Not found."))

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class _ShopHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # an idle keep-alive connection must not block shutdown

    def __init__(self, port: int, shop: Shop, verbose: bool) -> None:
        self.shop = shop
        self.verbose = verbose
        super().__init__((HOST, port), _Handler)


class ShopServer:
    """A running shop on 127.0.0.1: `url` while running; `stop()` ends it."""

    def __init__(self, shop: Shop, port: int = 0, verbose: bool = False) -> None:
        try:
            self._httpd = _ShopHTTPServer(port, shop, verbose)
        except OSError as e:
            raise ServerStartError(f"WebShop server could not start on {HOST}:{port}: {e.strerror or e}") from None
        self.shop = shop
        self.address = (HOST, self._httpd.server_address[1])  # bound to HOST, the port the OS chose
        self.url = f"http://{self.address[0]}:{self.address[1]}"
        # serve_forever checks for shutdown every 0.1 s, so stop() takes at most that long.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.1,), name=f"webshop-{self.address[1]}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def start_server(
    products_file: str | None = None,
    attributes_file: str | None = None,
    num_products: int | None = None,
    port: int = 0,
    verbose: bool = False,
) -> ShopServer:
    """Load the catalog (cached), index it and serve it on 127.0.0.1:`port` (0: a free port)."""
    catalog = load_catalog(products_file, attributes_file, num_products)
    return ShopServer(Shop(catalog, SearchIndex(catalog)), port, verbose)


# --- one shared server per process and catalog -------------------------------------------------
CatalogKey = tuple[str | None, str | None, int | None]
_shared: dict[CatalogKey, tuple[ShopServer, int]] = {}
_shared_lock = threading.Lock()


def acquire_server(key: CatalogKey) -> ShopServer:
    """The process's server for catalog `key` (products_file, attributes_file, num_products),
    started on first use; each call must be paired with one `release_server(key)`."""
    with _shared_lock:
        server, users = _shared.get(key) or (start_server(*key), 0)
        _shared[key] = (server, users + 1)
        return server


def release_server(key: CatalogKey) -> None:
    """Drop one use of `key`'s server; the last one stops it (a no-op once stopped at exit)."""
    with _shared_lock:
        if key not in _shared:
            return
        server, users = _shared.pop(key)
        if users > 1:
            _shared[key] = (server, users - 1)
        else:
            server.stop()


@atexit.register
def _stop_all() -> None:
    with _shared_lock:
        for server, _ in _shared.values():
            server.stop()
        _shared.clear()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m envs.webshop.server", description="Serve the WebShop on 127.0.0.1 for a browser."
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--products_file")
    parser.add_argument("--attributes_file")
    parser.add_argument("--num_products", type=int)
    parser.add_argument("--quiet", action="store_true", help="do not log requests")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        server = start_server(
            args.products_file, args.attributes_file, args.num_products, args.port, verbose=not args.quiet
        )
    except (CatalogError, ServerStartError) as e:
        sys.exit(f"python -m envs.webshop.server: {e}")
    took = time.perf_counter() - started
    print(
        f"WebShop ({len(server.shop.catalog.products)} products) at {server.url}/ "
        f"(started in {took:.2f}s); Ctrl-C stops it",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
