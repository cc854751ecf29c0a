"""The docs site as a reader gets it: built, served over HTTP on 127.0.0.1, read by headless Chromium.

Run by `.ci/run_docs_browser` (marked `lane`, so neither `.ci/run` nor the slow lane collects it).
`mkdocs build --strict` (tests/test_docs_site.py) checks links between Markdown files; this checks
the HTML: every page of mkdocs.yml's nav loads with 200 and no console error, every internal link
and image answers 200, every `#anchor` exists on its target page, the search box finds "GiGPO" and
the configuration reference's anchors resolve. Links to other hosts are listed, never fetched (this
machine has no internet). Chromium is the system's (ROLL_CHROMIUM, default /usr/bin/chromium),
driven by Playwright; ROLL_DOCS_SITE names a built site to serve, else the test builds one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import pytest
import yaml

pytestmark = pytest.mark.lane

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("ROLL_CHROMIUM", "/usr/bin/chromium"))
# No connection of Chromium's own (updates, sync, field trials): on a closed network they fail at
# every start. QUIC and the GPU are off for a headless run in a container.
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Resources from other hosts a page may ask for, and why. The test fetches none of them (nor links to
# other hosts): it aborts the request, lists it, and excuses the errors that name it. Any other
# resource from another host fails the test, so that the site keeps working offline.
NEEDS_INTERNET = {
    "https://unpkg.com/mermaid@11/dist/mermaid.min.js": "mkdocs-material draws architecture.md's diagram with it",
}
PAGE_FACTS = """() => {
  const resolve = (value) => { try { return new URL(value, document.baseURI).href; } catch { return value; } };
  return {
    links: [...document.querySelectorAll('a[href]')].map((a) => resolve(a.getAttribute('href'))),
    images: [...document.querySelectorAll('img[src]')].map((img) => resolve(img.getAttribute('src'))),
    broken_images: [...document.querySelectorAll('img[src]')]
      .filter((img) => img.complete && img.naturalWidth === 0).map((img) => resolve(img.getAttribute('src'))),
    ids: [...document.querySelectorAll('[id], a[name]')].map((e) => e.id || e.getAttribute('name')),
    text: document.body.innerText,
  };
}"""


class _MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml with its `!!python/name:` tags read as None: only the nav is wanted."""


_MkdocsLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_paths(mkdocs_yml: Path) -> list[str]:
    """Site paths of the nav's pages, in nav order: 'index.md' -> '', 'engines/hf.md' -> 'engines/hf/'."""

    def files(node: object) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from files(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from files(value)

    config = yaml.load(mkdocs_yml.read_text(encoding="utf-8"), Loader=_MkdocsLoader)
    paths = []
    for name in files(config["nav"]):
        stem = name.removesuffix(".md")
        paths.append(stem.removesuffix("index") if stem == "index" or stem.endswith("/index") else stem + "/")
    return paths


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """`python -m http.server` on 127.0.0.1 and a free port (port 0: the server picks and prints it)."""
    command = [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(directory), "0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first_line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 41234 (http://...) ..."
        port = re.search(r"port (\d+)", first_line)
        assert port, f"http.server did not start: {first_line!r}"
        yield f"http://127.0.0.1:{port.group(1)}/"
    finally:
        server.terminate()
        server.wait(timeout=10)


@dataclass
class PageReport:
    """What one page gave the browser."""

    url: str
    status: int
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed requests
    excused: list[str] = field(default_factory=list)  # the same, about a resource of NEEDS_INTERNET
    external_resources: list[str] = field(default_factory=list)  # requested from other hosts, aborted
    links: list[str] = field(default_factory=list)  # absolute URLs of every a[href]
    images: list[str] = field(default_factory=list)  # absolute URLs of every img[src]
    broken_images: list[str] = field(default_factory=list)  # loaded, but with no picture
    ids: set[str] = field(default_factory=set)
    text: str = ""


class Site:
    """One served site seen through one browser context; each URL is visited or fetched once."""

    def __init__(self, context, base: str) -> None:
        self.context = context
        self.base = base
        self.origin = urlsplit(base).netloc
        self.pages: dict[str, PageReport] = {}
        self.statuses: dict[str, int] = {}

    def is_internal(self, url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and parts.netloc == self.origin

    def visit(self, url: str) -> PageReport:
        """Load `url` in a new tab and wait for the network to go quiet; cached."""
        url = urldefrag(url).url
        if url in self.pages:
            return self.pages[url]
        report = PageReport(url, status=0)
        page = self.context.new_page()
        page.route(lambda requested: not self.is_internal(requested), lambda route: self._abort(route, report))
        page.on("console", lambda message: self._console(message, report))
        page.on("pageerror", lambda error: self._error(f"exception: {error}", str(error), report))
        page.on("requestfailed", lambda request: self._request_failed(request, report))
        try:
            response = page.goto(url, wait_until="load")
            page.wait_for_load_state("networkidle")
            facts = page.evaluate(PAGE_FACTS)
        finally:
            page.close()
        report.status = response.status if response else 0
        report.links, report.images, report.broken_images = facts["links"], facts["images"], facts["broken_images"]
        report.ids, report.text = set(facts["ids"]), facts["text"]
        self.pages[url] = report
        self.statuses[url] = report.status
        return report

    @staticmethod
    def _abort(route, report: PageReport) -> None:
        report.external_resources.append(route.request.url)
        route.abort()

    @staticmethod
    def _error(error: str, about: str, report: PageReport) -> None:
        """An error counts unless it is about a resource of NEEDS_INTERNET (then it is listed)."""
        excused = any(resource in about for resource in NEEDS_INTERNET)
        (report.excused if excused else report.errors).append(error)

    def _console(self, message, report: PageReport) -> None:
        if message.type == "error":  # a failed load names its resource in the location, not the text
            where = message.location.get("url", "")
            self._error(f"console: {message.text} ({where})", f"{where} {message.text}", report)

    def _request_failed(self, request, report: PageReport) -> None:
        self._error(f"request failed: {request.url} ({request.failure})", request.url, report)

    def status(self, url: str) -> int:
        """HTTP status of an internal URL (redirects followed), without a browser tab; cached."""
        url = urldefrag(url).url
        if url not in self.statuses:
            self.statuses[url] = self.context.request.get(url).status
        return self.statuses[url]

    def anchor_exists(self, url: str) -> bool:
        target, fragment = urldefrag(url)
        return not fragment or unquote(fragment) in self.visit(target).ids

    def problems(self, report: PageReport) -> list[str]:
        """Every broken internal link, image or anchor of one visited page, as 'page -> target: why'."""
        found = []
        for image in sorted(set(report.images)):
            if self.is_internal(image) and self.status(image) != 200:
                found.append(f"{report.url} -> image {image}: HTTP {self.status(image)}")
        found += [f"{report.url} -> image {image}: no picture" for image in sorted(set(report.broken_images))]
        for link in sorted(set(report.links)):
            if not self.is_internal(link):
                continue
            if self.status(link) != 200:
                found.append(f"{report.url} -> {link}: HTTP {self.status(link)}")
            elif urldefrag(link).fragment and not self.anchor_exists(link):
                found.append(f"{report.url} -> {link}: no such anchor")
        return found


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("ROLL_DOCS_SITE"):
        return Path(os.environ["ROLL_DOCS_SITE"])
    site = tmp_path_factory.mktemp("docs") / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return site


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (.ci/run_docs_browser)")
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run_docs_browser does)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@contextmanager
def open_site(browser, directory: Path) -> Iterator[Site]:
    with serve(directory) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        try:
            yield Site(context, base)
        finally:
            context.close()


@pytest.fixture(scope="module")
def site(browser, site_dir: Path) -> Iterator[Site]:
    with open_site(browser, site_dir) as opened:
        yield opened


@pytest.fixture(scope="module")
def nav_urls(site: Site) -> list[str]:
    paths = nav_paths(ROOT / "mkdocs.yml")
    assert len(paths) >= 30, paths  # the nav was read, not an empty list that passes every check
    return [urljoin(site.base, path) for path in paths]


def test_every_nav_page_loads_with_200_and_no_console_error(site: Site, nav_urls: list[str]) -> None:
    failures = []
    for url in nav_urls:
        report = site.visit(url)
        if report.status != 200:
            failures.append(f"{url}: HTTP {report.status}")
        failures += [f"{url}: {error}" for error in report.errors]
        unexpected = sorted(set(report.external_resources) - NEEDS_INTERNET.keys())
        failures += [f"{url}: loads {resource} from another host" for resource in unexpected]
        for resource in sorted(set(report.external_resources) & NEEDS_INTERNET.keys()):
            print(f"{url} needs {resource}, not fetched here: {NEEDS_INTERNET[resource]}")
    assert not failures, "\n".join(failures)


def test_no_broken_link_image_or_anchor(site: Site, nav_urls: list[str]) -> None:
    problems = [problem for url in nav_urls for problem in site.problems(site.visit(url))]
    internal = {link for url in nav_urls for link in site.visit(url).links if site.is_internal(link)}
    assert len(internal) > 100, internal  # links were found at all
    external = Counter(link for url in nav_urls for link in set(site.visit(url).links) if not site.is_internal(link))
    print(f"{len(external)} external links (listed, not fetched; pages linking to each):")
    for link, pages in sorted(external.items()):
        print(f"  {pages:3d}  {link}")
    assert not problems, "\n".join(problems)


def test_search_finds_gigpo(site: Site) -> None:
    page = site.context.new_page()
    try:
        page.goto(site.base, wait_until="load")
        page.locator("input.md-search__input").click()
        page.keyboard.type("GiGPO")
        page.wait_for_selector(".md-search-result__item a", timeout=30_000)
        results = page.eval_on_selector_all(".md-search-result__item a", "links => links.map(a => a.href)")
    finally:
        page.close()
    assert results and all(site.is_internal(result) for result in results), results
    # a result is page?h=gigpo#section: the page (read as the nav crawl read it) and the section
    pages = list(dict.fromkeys(urlsplit(result)._replace(query="", fragment="").geturl() for result in results))
    with_gigpo = [page for page in pages if "GiGPO" in site.visit(page).text]
    assert pages[0] in with_gigpo, f"the first result's page does not say GiGPO: {results}"
    missing = [result for result in results if not site.anchor_exists(urlsplit(result)._replace(query="").geturl())]
    assert not missing, f"search results into sections that do not exist: {missing}"
    print(f"search for GiGPO: {len(results)} results on {len(pages)} pages, {len(with_gigpo)} of them say GiGPO")


def test_the_configuration_reference_anchors_resolve(site: Site, nav_urls: list[str]) -> None:
    reference = urljoin(site.base, "configuration/")
    into_reference = {
        link
        for url in nav_urls
        for link in site.visit(url).links
        if urldefrag(link).url == reference and urldefrag(link).fragment
    }
    sections = re.findall(r"\(#([\w-]+)\)", (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"))
    assert len(sections) >= 20, sections  # the page's own "Sections:" line
    assert {urljoin(reference, "#" + section) for section in sections} <= into_reference
    missing = sorted(link for link in into_reference if not site.anchor_exists(link))
    assert not missing, "\n".join(missing)


def test_the_checks_catch_a_broken_page(browser, site_dir: Path, tmp_path: Path) -> None:
    """The same checks over a copy of the site with a broken link, anchor and image and a console error."""
    broken = tmp_path / "site"
    shutil.copytree(site_dir, broken)
    page_file = broken / "algorithms" / "index.html"
    planted = (
        '<a href="../no_such_page/">gone</a> <a href="../configuration/#no-such-key">no key</a>'
        ' <img src="../img/no_such_plot.png" alt="gone"> <script>console.error("planted error")</script>'
    )
    page_file.write_text(page_file.read_text(encoding="utf-8").replace("</article>", planted + "</article>", 1))
    with open_site(browser, broken) as site:
        report = site.visit(urljoin(site.base, "algorithms/"))
        problems = "\n".join(site.problems(report))
        errors = "\n".join(report.errors)
        clean = site.visit(urljoin(site.base, "engines/hf/"))
        assert not site.problems(clean) and not clean.errors, (site.problems(clean), clean.errors)
    assert "no_such_page/: HTTP 404" in problems, problems
    assert "configuration/#no-such-key: no such anchor" in problems, problems
    assert "image " + urljoin(site.base, "img/no_such_plot.png") + ": HTTP 404" in problems, problems
    assert "planted error" in errors, errors
