"""How the suite runs in parallel (scripts/test.sh, tests/conftest.py) and what the README
says it costs: a module's tests share one pytest-xdist worker, the modules that read one
session fixture's runs share one, and the stated time is the one the docs table gives."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import SimpleNamespace

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


class _Item(SimpleNamespace):
    def add_marker(self, mark):
        self.marks.append(mark)


def _groups(names):
    items = [_Item(path=Path("tests") / name, marks=[]) for name in names]
    conftest.pytest_collection_modifyitems(items)
    return [[m.args[0] for m in item.marks if m.name == "xdist_group"] for item in items]


def test_each_module_is_one_group_and_the_shared_fixture_modules_are_one():
    groups = _groups(["test_a.py", "test_a.py", "test_b.py", "test_lm_presses.py",
                      "test_lm_shared_prefill.py"])
    assert all(len(g) == 1 for g in groups)
    a1, a2, b, presses, prefill = (g[0] for g in groups)
    assert a1 == a2 != b
    assert presses == prefill not in (a1, b)


def test_the_modules_sharing_kvpress_runs_are_the_ones_that_use_it():
    """A module that starts reading the session fixture ``kvpress_runs`` must join its group
    (or it computes the runs again on another worker)."""
    users = {p.name for p in (ROOT / "tests").glob("test_*.py")
             if p.name != Path(__file__).name and re.search(r"\bkvpress_runs\b", p.read_text())}
    assert users == set(conftest._SHARED_WORKER)


def test_the_test_command_runs_one_worker_per_core_grouped_by_module():
    script = (ROOT / "scripts" / "test.sh").read_text()
    pytest_line = next(line for line in script.replace("\\\n", " ").splitlines()
                       if "-m pytest" in line)
    words = shlex.split(pytest_line)
    assert words[words.index("-n") + 1] == "$workers"
    assert words[words.index("--dist") + 1] == "loadgroup"
    assert 'workers="${KVDRIFT_TEST_WORKERS:-$(nproc)}"' in script


def _minutes(text: str, pattern: str) -> str:
    found = re.search(pattern, text)
    assert found, f"no match for {pattern!r}"
    return found.group(1)


def test_the_readme_states_the_suites_time_as_the_development_guide_measures_it():
    readme = (ROOT / "README.md").read_text()
    guide = (ROOT / "docs" / "development.md").read_text()
    stated = _minutes(readme, r"`test\.sh --all` takes about (\d+) minutes")
    measured = _minutes(guide, r"\| `bash scripts/test\.sh --all` \|[^|]*\| about (\d+) min")
    assert stated == measured
