"""WebShop HTTP server, started for real on a free loopback port: endpoints, errors, sharing."""

import http.client
import json
import socket
from urllib.parse import urlencode

import pytest

from envs.webshop import server as server_module
from envs.webshop.catalog import load_catalog
from envs.webshop.client import ShopClient, ShopConnectionError
from envs.webshop.page_text import parse_page
from envs.webshop.server import (
    HOST,
    ServerStartError,
    acquire_server,
    release_server,
    start_server,
)


@pytest.fixture(scope="module")
def shop():
    server = start_server()
    yield server
    server.stop()


def request(server, method, path, body=None):
    conn = http.client.HTTPConnection(*server.address, timeout=10)
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    result = response.status, response.getheader("Location"), response.read().decode()
    conn.close()
    return result


def start(server, sid, **fields):
    return request(server, "POST", f"/s/{sid}/start", urlencode(fields))


def test_binds_to_loopback_only(shop):
    assert HOST == "127.0.0.1"
    assert shop.address[0] == "127.0.0.1" and shop.address[1] > 0
    assert shop._httpd.socket.getsockname()[0] == "127.0.0.1"
    assert shop.url == f"http://127.0.0.1:{shop.address[1]}"


def test_health(shop):
    status, _, body = request(shop, "GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok", "products": 300}


def test_browser_root_starts_a_session_on_a_random_goal(shop):
    status, location, _ = request(shop, "GET", "/?seed=5")
    assert status == 303 and location.startswith("/s/web-") and location.endswith("/")
    status, _, html = request(shop, "GET", location)
    page = parse_page(html)
    assert status == 200 and page.data["page"] == "search"
    assert page.text.startswith("WebShop\nInstruction: ") and page.search_action is not None


def test_session_pages_and_a_single_purchase(shop):
    goal = load_catalog().goal_products[0]
    name, values = goal.options[0]
    fields = {"asin": goal.asin, "price_upper": "1000.0", f"option:{name}": values[0]}
    status, _, html = start(shop, "t1", **fields)
    assert status == 200 and parse_page(html).data["page"] == "search"
    buy = f"/s/t1/buy/{goal.asin}?" + urlencode({f"option:{name}": values[0]})
    first = request(shop, "GET", buy)
    reward = parse_page(first[2]).reward
    assert first[0] == 200 and reward["reward"] == "1.0" and reward["options-matched"] == "1"
    # buying again (even something else) shows the first purchase
    other = load_catalog().products[0].asin
    assert request(shop, "GET", f"/s/t1/buy/{other}")[2] == first[2]
    assert request(shop, "POST", "/s/t1/end")[0] == 200
    assert request(shop, "GET", "/s/t1/")[0] == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("GET", "/nowhere", None, 404, "no page"),
        ("GET", "/s/nobody/", None, 404, "no session"),
        ("GET", "/s/t2/item/B0NOTHERE0", None, 404, "no product"),
        ("GET", "/s/t2/search?q=shoes&page=99", None, 400, "page must be an integer in [1, 3]"),
        ("GET", "/s/t2/search", None, 400, "missing"),
        ("POST", "/s/bad%20id/start", "asin=x", 400, "session id must match"),
        ("POST", "/s/t3/start", "asin=B0NOTHERE0", 404, "no product"),
        ("POST", "/s/t3/elsewhere", "", 404, "Not found."),
        ("GET", "/s/t2/search?q=shoes&page=%C2%B2", None, 400, "page must be an integer in [1, 3]"),  # "²"
        ("GET", "/s/t2/search?q=shoes&page=" + "9" * 5000, None, 400, "page must be an integer in [1, 3]"),
        ("GET", "/s/t2/search?q=shoes&page=%D9%A3", None, 400, "page must be an integer in [1, 3]"),  # Arabic 3
    ],
)
def test_bad_requests(shop, method, path, body, status, message):
    goal = load_catalog().goal_products[0]
    start(shop, "t2", asin=goal.asin)
    got, _, html = request(shop, method, path, body)
    assert got == status and message in html


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"option:color": "plaid"}, "has no option color: plaid"),
        ({"price_upper": "nan"}, "price_upper must be a number &gt; 0, got nan"),
        ({"price_upper": "cheap"}, "could not convert string to float"),
        ({"per_page": "0"}, "per_page must be an integer in [1, 50], got &#x27;0&#x27;"),
    ],
)
def test_bad_session_start(shop, fields, message):
    goal = load_catalog().goal_products[0]
    status, _, html = start(shop, "t4", asin=goal.asin, **fields)
    assert status == 400 and message in html


def test_a_product_without_instruction_cannot_be_a_goal(shop):
    plain = next(p for p in load_catalog().products if p.instruction is None)
    status, _, html = start(shop, "t5", asin=plain.asin)
    assert status == 400 and f"{plain.asin} has no instruction, so it cannot be a goal" in html


def test_port_in_use_is_a_one_line_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerStartError) as err:
            start_server(port=port)
    assert str(err.value).startswith(f"WebShop server could not start on 127.0.0.1:{port}: ")
    assert "\n" not in str(err.value)


def test_shared_server_is_refcounted():
    key = (None, None, 50)  # a key no other test uses
    first = acquire_server(key)
    assert acquire_server(key) is first
    release_server(key)
    assert request(first, "GET", "/health")[0] == 200  # one user left
    release_server(key)
    assert key not in server_module._shared
    with pytest.raises(ConnectionRefusedError):
        request(first, "GET", "/health")
    release_server(key)  # after the last release (e.g. at exit): a no-op


def test_client_retries_then_names_the_server():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    client = ShopClient(f"http://127.0.0.1:{port}", timeout_s=1.0, retries=2)
    with pytest.raises(
        ShopConnectionError,
        match=rf"^WebShop server http://127.0.0.1:{port} did not answer GET /health "
        r"after 3 tries: ConnectionRefusedError",
    ):
        client.get("/health")


def test_client_error_status_is_not_retried(shop):
    client = ShopClient(shop.url, timeout_s=5.0, retries=2)
    with pytest.raises(ShopConnectionError, match=r"GET /nowhere -> 404$"):
        client.get("/nowhere")
    assert json.loads(client.get("/health"))["status"] == "ok"  # the connection is still usable
    client.close()


def test_odd_numbers_elsewhere_get_an_answer_not_a_dropped_connection(shop):
    assert request(shop, "GET", "/?seed=%C2%B2")[0] == 303  # not a seed: a session all the same
    assert request(shop, "GET", "/?seed=" + "7" * 5000)[0] == 303
    conn = http.client.HTTPConnection(*shop.address, timeout=10)
    conn.putrequest("POST", "/s/t9/start")
    conn.putheader("Content-Length", "\u00b2".encode("utf-8").decode("latin-1"))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()


def test_a_short_body_times_out_instead_of_holding_a_thread(shop, monkeypatch):
    import time

    monkeypatch.setattr(server_module._Handler, "timeout", 0.5)
    with socket.create_connection(shop.address, timeout=10) as sock:
        sock.sendall(b"POST /s/t9/start HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nasin=")
        started = time.monotonic()
        assert sock.recv(100) == b""  # the server gave up on the missing 95 bytes and closed
        assert time.monotonic() - started < 5


def test_idle_sessions_are_bounded(shop, monkeypatch):
    from envs.webshop import shop as shop_module

    monkeypatch.setattr(shop_module, "MAX_SESSIONS", 50)
    for _ in range(120):  # a browser (or a crawler) hitting GET / again and again
        assert request(shop, "GET", "/")[0] == 303
    assert shop.shop.num_sessions() == 50
    monkeypatch.setattr(shop_module, "SESSION_TTL_S", 0.0)
    request(shop, "GET", "/")
    assert shop.shop.num_sessions() == 1  # every older one had been idle past the TTL
