"""The env's HTTP client: one keep-alive connection, a timeout per request, retries.

A request that fails on the way (refused, reset, timed out, a closed keep-alive connection) is
sent again on a new connection, up to `retries` more times with a short growing pause; every
request is safe to repeat (a session start replaces the session, a second purchase shows the
first). An HTTP error status is not retried: it means the env asked for a wrong page.
"""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlencode, urlsplit


class ShopConnectionError(RuntimeError):
    """The shop server did not answer, or answered with an error status."""


class ShopClient:
    """GET / POST text pages of one shop server (`base_url` like "http://127.0.0.1:8123")."""

    def __init__(self, base_url: str, timeout_s: float, retries: int) -> None:
        url = urlsplit(base_url)
        self.base_url = base_url
        self._host, self._port = url.hostname or "127.0.0.1", url.port
        self.timeout_s = timeout_s
        self.retries = retries
        self._conn: http.client.HTTPConnection | None = None

    def _request_once(self, method: str, path: str, body: str | None) -> tuple[int, str]:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body is not None else {}
        self._conn.request(method, path, body=body, headers=headers)
        response = self._conn.getresponse()
        return response.status, response.read().decode("utf-8")

    def request(self, method: str, path: str, fields: dict[str, str] | None = None) -> str:
        """The body of the answer to `method path` (with form `fields` for POST)."""
        body = None if fields is None else urlencode(fields)
        for attempt in range(self.retries + 1):
            try:
                status, text = self._request_once(method, path, body)
                break
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt == self.retries:
                    raise ShopConnectionError(
                        f"WebShop server {self.base_url} did not answer {method} {path} "
                        f"after {self.retries + 1} tries: {e!r}"
                    ) from None
                time.sleep(0.05 * 2**attempt)
        if status != 200:
            raise ShopConnectionError(f"WebShop server {self.base_url}: {method} {path} -> {status}")
        return text

    def get(self, path: str) -> str:
        return self.request("GET", path)

    def post(self, path: str, fields: dict[str, str]) -> str:
        return self.request("POST", path, fields)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
