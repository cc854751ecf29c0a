"""A shop page's HTML as the env sees it: text with `[clickables]`, and what each click opens.

Like WebShop's "simple" observation mode, but written for our pages (`envs.webshop.pages`): a link
is `[label]`, a submit button is `[label]` too (the search box, used with `search[...]`), block
elements start new lines, blank lines are dropped, `<head>` is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

_BLOCKS = frozenset({"div", "p", "h1", "h2", "li", "ul", "form", "br"})
_SKIPPED = frozenset({"head", "script", "style", "title"})


def normalise_label(label: str) -> str:
    """The key a clickable is matched by: case-insensitive, whitespace-normalised."""
    return " ".join(label.split()).casefold()


@dataclass
class Page:
    """One parsed page."""

    text: str
    clickables: dict[str, tuple[str, str]] = field(default_factory=dict)
    """normalised label -> (label as shown, href); the first of equal labels wins."""
    search_action: str | None = None
    """Where the search box submits to, or None on a page without one."""
    selected: frozenset[str] = frozenset()
    """Labels of the links marked selected (chosen options)."""
    data: dict[str, str] = field(default_factory=dict)
    """`<body data-*>` (the page kind, asin, page number), keys without "data-"."""
    reward: dict[str, str] | None = None
    """`data-*` of the `#reward` element of the purchase page, else None."""


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = [""]
        self.page = Page(text="")
        self._skip_depth = 0
        self._link: tuple[str, bool, list[str]] | None = None  # (href, selected, text)
        self._selected: set[str] = set()

    def _write(self, text: str) -> None:
        if self._link is not None:
            self._link[2].append(text)
        else:
            self.lines[-1] += text

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag in _SKIPPED:
            self._skip_depth += 1
        elif tag in _BLOCKS:
            self.lines.append("")
        if tag == "body":
            self.page.data = {k[5:]: v for k, v in values.items() if k.startswith("data-")}
        elif tag == "a":
            self._link = (values.get("href", ""), "selected" in values.get("class", "").split(), [])
        elif tag == "form":
            self.page.search_action = values.get("action", "")
        elif tag == "button":
            self._write(" [")
        if values.get("id") == "reward":
            self.page.reward = {k[5:]: v for k, v in values.items() if k.startswith("data-")}

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag == "a" and self._link is not None:
            href, selected, parts = self._link
            self._link = None
            label = " ".join("".join(parts).split())
            if label:
                self.page.clickables.setdefault(normalise_label(label), (label, href))
                if selected:
                    self._selected.add(label)
                self._write(f" [{label}]")
        elif tag == "button":
            self._write("]")
        elif tag in _BLOCKS:
            self.lines.append("")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self._write(data)

    def result(self) -> Page:
        lines = (" ".join(line.split()) for line in self.lines)
        self.page.text = "\n".join(line for line in lines if line)
        self.page.selected = frozenset(self._selected)
        return self.page


def parse_page(html: str) -> Page:
    """The `Page` of one HTML document."""
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    return parser.result()
