"""Regenerate what the README and the docs show of the demo, from the demo's own store.

Run the demo first (``bash scripts/demo.sh``), then::

    .venv/bin/python scripts/demo_docs.py [kvdrift-out/cpu-demo]

It copies the report's figures to ``docs/images/demo-*.png``, rewrites the README's ``kvdrift
show`` excerpt, and writes ``docs/images/demo-numbers.json``: the numbers the pages quote
(who never parted, the exposure share of the SnapKV-minus-recent contrast), the figures'
digests and one unit's records. ``tests/test_docs_demo.py`` holds the pages to that file, and
in the slow lane recomputes the unit with today's code: when the code changes what the demo
gives, the test says to run this again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ROOT / "docs" / "images" / "demo-numbers.json"
FIGURES = ("timing", "contrasts", "expected_delta", "risk_memory")
#: The unit the slow lane recomputes: the replicate the README shows is one of its four.
UNIT = {"doc_id": "ruler-niah_single-512-s0-001", "action": "snapkv-half"}
SHOWN = "snapkv-half"  # the action whose median divergence the README shows
CONTEXT = 2  # positions shown either side of tau


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unit_records(steps, replicates) -> list[dict]:
    """Per replicate of :data:`UNIT`: tau and P's and Q's tokens (what the demo's numbers,
    figures and excerpt are made of)."""
    reps = replicates[(replicates.doc_id == UNIT["doc_id"])
                      & (replicates.action == UNIT["action"])].sort_values("replicate")
    rows = []
    for r in reps.itertuples():
        seq = steps[(steps.doc_id == UNIT["doc_id"]) & (steps.action == UNIT["action"])
                    & (steps.replicate == r.replicate)].sort_values("t")
        rows.append({"replicate": int(r.replicate), "tau": int(r.tau),
                     "x": [int(v) for v in seq.x_token], "y": [int(v) for v in seq.y_token]})
    return rows


def show_excerpt(store: Path) -> str:
    """``kvdrift show STORE --action snapkv-half``'s median-divergence replicate, its table cut
    to tau +- CONTEXT positions (``...`` marks the cuts)."""
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200")
    out = subprocess.run([sys.executable, "-m", "kvdrift.cli", "show", str(store), "--action",
                          SHOWN], capture_output=True, text=True, check=True, env=env).stdout
    block = next(b for b in out.split("\n\n") if "(median divergence)" in b)
    lines = block.strip("\n").splitlines()
    # the heading, the prompt and P's and Q's text wrap at 80 columns: the head ends at the
    # table's header line, the tail starts at P's text
    header = next(i for i, line in enumerate(lines) if re.match(r"^ +t  P ", line))
    text = next(i for i, line in enumerate(lines) if line.startswith("P: "))
    head, table, tail = lines[:header + 1], lines[header + 1:text], lines[text:]
    at = next(i for i, line in enumerate(table) if line.startswith("τ▶"))
    cut = table[max(at - CONTEXT, 0):at + CONTEXT + 1]
    return "\n".join([*head, "    ...", *cut, "    ...", *tail])


def numbers(store: Path) -> dict:
    from kvdrift.directory import StudyDirectory

    study = StudyDirectory(store)
    analysis = json.loads((store / "report" / "analysis.json").read_text(encoding="utf-8"))
    never = {}
    for action in analysis["actions"]:  # 1 - P(tau <= H)
        never[action["action"]] = round(1 - action["scalars"]["p_diverge"]["estimate"], 4)
    contrast = next(c for c in analysis["contrasts"]
                    if (c["a"], c["b"]) == ("snapkv-half", "recent-half"))
    records = study.records()
    return {"never_diverged": dict(sorted(never.items())),
            "exposure_share": round(contrast["exposure_share"]["estimate"], 6),
            "figures": {name: digest(ROOT / "docs" / "images" / f"demo-{name}.png")
                        for name in FIGURES},
            "unit": UNIT, "unit_records": unit_records(records.steps, records.replicates),
            "show": show_excerpt(store)}


def rewrite_readme(excerpt: str) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(r"(\(here from the demo's store\):\n\n```text\n).*?(\n```)", re.S)
    if not pattern.search(text):
        raise SystemExit("README.md: the show excerpt's block was not found")
    readme.write_text(pattern.sub(lambda m: m.group(1) + excerpt + m.group(2), text),
                      encoding="utf-8")


def main(store: Path) -> None:
    figures = store / "report" / "figures"
    for name in FIGURES:
        shutil.copyfile(figures / f"{name}.png", ROOT / "docs" / "images" / f"demo-{name}.png")
    found = numbers(store)
    rewrite_readme(found["show"])
    NUMBERS.write_text(json.dumps(found, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    never = ", ".join(f"{a} {v:.1%}" for a, v in found["never_diverged"].items())
    print(f"never diverged within H: {never}; exposure share {found['exposure_share']:.1%}")
    print(f"wrote {NUMBERS.relative_to(ROOT)}, the figures and README.md's show excerpt; "
          "update the pages' numbers if they changed (tests/test_docs_demo.py checks them)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "kvdrift-out" / "cpu-demo"))
