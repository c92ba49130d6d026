"""The documentation site works opened from the disk with no network: search (Material's
offline plugin with kvdrift's own worker shim), math drawn at build time, every page's assets
local, the tutorial's in-page links resolving, the API reference's sections present.

The site is built once (``mkdocs build --strict``, ~20 s), in the slow lane."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d",
                    str(out)], cwd=ROOT, env=env, check=True)
    return out


def _pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def test_no_page_loads_anything_from_another_host(site):
    external = re.compile(r'<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)="(?:https?:)?//')
    for page in _pages(site):
        text = page.read_text(encoding="utf-8")
        assert not external.search(text), page.name
        assert "unpkg.com" not in text, page.name  # the offline plugin's default shim


def test_search_reads_an_inlined_index_and_runs_its_worker_from_a_file(site):
    """The offline plugin inlines the index; the shim loads before Material's bundle; and,
    in Node with a stand-in for a file:// page, Material's own search worker runs through
    the shim and finds a page."""
    index = (site / "search" / "search_index.js").read_text(encoding="utf-8")
    assert index.startswith("var __index = {")
    page = (site / "index.html").read_text(encoding="utf-8")
    shim = page.index('src="javascripts/iframe-worker.js"')
    assert shim < page.index('src="assets/javascripts/bundle.')
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the shim's run is not checked")
    (worker,) = (site / "assets" / "javascripts" / "workers").glob("search.*.min.js")
    found = subprocess.run([node, str(ROOT / "tests" / "js" / "file_search.js"),
                            str(site / "javascripts" / "iframe-worker.js"), str(worker),
                            str(site / "search" / "search_index.json"), "divergence"],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stdout + found.stderr
    answer = json.loads(found.stdout.splitlines()[-1])
    assert answer["worker"] == "IFrameWorker" and answer["results"] > 0
    assert (site / answer["first"].split("#")[0]).is_file()


def test_math_is_drawn_as_svg_at_build_time(site):
    source = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    formulas = len(re.findall(r"\$\$.+?\$\$|\$[^$\s][^$]*?\$", source))
    page = (site / "concepts.html").read_text(encoding="utf-8")
    drawn = re.findall(r'class="arithmatex"><svg role="img" aria-label="([^"]*)"', page)
    assert formulas >= 5 and len(drawn) == formulas
    assert "\\Delta R = \\Delta O" in " ".join(drawn)  # the label keeps the TeX, for readers
    assert "\\(" not in page and "\\[" not in page


def test_the_tutorials_in_page_links_resolve(site):
    page = (site / "tutorial.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    links = set(re.findall(r'\bhref="#([^"]+)"', page))
    assert links and links <= ids, links - ids


def test_the_api_reference_has_each_public_function_with_parameters(site):
    import kvdrift

    page = (site / "api.html").read_text(encoding="utf-8")
    for name in kvdrift.__all__:
        if name == "__version__":
            continue
        obj = getattr(kvdrift, name)
        assert f'id="{obj.__module__}.{obj.__qualname__}"' in page, name
    measure = page[page.index('id="kvdrift.api.measure"'):page.index('id="kvdrift.api.run_study"')]
    for word in ("Parameters", "Returns", "replicates", "horizon", "attention", "Example"):
        assert word in measure, word
