"""What the README and the docs show of the demo is what the demo gives today.

``scripts/demo_docs.py`` writes ``docs/images/demo-numbers.json`` from the demo's store (with
the figures and the README's ``show`` excerpt). The fast tests hold the pages to that file;
the slow one recomputes one of the demo's units with today's code and holds the file to it,
so a change that moves the demo's numbers fails here until the demo is rerun and the pages
regenerated (``bash scripts/demo.sh && .venv/bin/python scripts/demo_docs.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = json.loads((ROOT / "docs" / "images" / "demo-numbers.json").read_text("utf-8"))
REGENERATE = "rerun the demo, then scripts/demo_docs.py (see its docstring)"


def _generator():
    """scripts/demo_docs.py as a module: the test reads records as the generator does."""
    spec = importlib.util.spec_from_file_location("demo_docs", ROOT / "scripts" / "demo_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(name: str) -> str:
    return " ".join((ROOT / name).read_text(encoding="utf-8").split())  # lines joined


def test_the_figures_are_the_ones_the_numbers_were_read_with():
    for name, digest in NUMBERS["figures"].items():
        found = hashlib.sha256((ROOT / "docs" / "images" / f"demo-{name}.png").read_bytes())
        assert found.hexdigest() == digest, f"docs/images/demo-{name}.png: {REGENERATE}"


def test_the_readmes_show_excerpt_is_the_demos():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\(here from the demo's store\):\n\n```text\n(.*?)\n```", readme, re.S)
    assert block is not None and block.group(1) == NUMBERS["show"], REGENERATE
    lines = NUMBERS["show"].splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("tau = "))
    heading = " ".join(line.strip() for line in lines[:end])  # wrapped at 80 columns
    shown = re.search(r"· (\S+) · replicate (\d+)", heading)
    unit = NUMBERS["unit"]
    assert shown is not None and shown.group(1) == unit["action"]
    assert unit["doc_id"] in heading  # the replicate shown is one the slow test recomputes
    record = NUMBERS["unit_records"][int(shown.group(2))]
    assert lines[end].startswith(f"tau = {record['tau']}, ")
    assert all(len(line) <= 80 for line in lines)


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/concepts.md"])
def test_the_pages_quote_who_never_parted_as_the_demo_gives_it(page):
    never = NUMBERS["never_diverged"]
    text = _page(page)
    assert f"(never diverged {never['recent-half']:.1%})" in text, REGENERATE
    assert f"SnapKV in all but {never['snapkv-half']:.1%}" in text, REGENERATE


def test_the_concepts_page_quotes_the_exposure_share_the_demo_gives():
    share = NUMBERS["exposure_share"]
    assert f"mostly exposure ({share:.1%})" in _page("docs/concepts.md"), REGENERATE
    assert 0.5 < share <= 1  # "mostly" holds


@pytest.mark.slow
def test_todays_code_gives_the_demos_unit_as_recorded():
    """One (document, action) unit of the demo, run as the demo runs it (its TOML's settings,
    the document generated from its [[documents]] table), gives the tokens recorded."""
    from transformers import AutoTokenizer

    import kvdrift

    study = kvdrift.load_study(kvdrift.shipped_config("cpu-demo"))
    tokenizer = AutoTokenizer.from_pretrained(kvdrift.embedded_model_path())
    (source,) = study.documents
    doc = next(d for d in source.documents(tokenizer) if d.id == NUMBERS["unit"]["doc_id"])
    run = study.run
    result = kvdrift.measure(
        "smollm2", (NUMBERS["unit"]["action"],), [doc], bootstrap=0,
        replicates=run.replicates, horizon=run.horizon, temperature=run.temperature,
        estimator=run.estimator.name, depths=run.depths, seed=run.seed, device="cpu",
        dtype="float32")
    found = _generator().unit_records(result.records.steps, result.records.replicates)
    assert [r["tau"] for r in found] == [r["tau"] for r in NUMBERS["unit_records"]], REGENERATE
    assert found == NUMBERS["unit_records"], REGENERATE
