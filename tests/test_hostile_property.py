"""Random hostile text (any script, control characters, lone surrogates, very long strings) as
document ids, answers, actions and output paths through ``run``, ``report`` and ``analyze``:
never a traceback, nothing written outside ``--out``, no raw control character on the
terminal. A fixed seed and a handful of examples keep it reproducible and quick."""

import json
import random
import re
import unicodedata

import pytest
from typer.testing import CliRunner

import kvdrift
from kvdrift.cli import app
from kvdrift.text import UNPRINTABLE

runner = CliRunner()
PROMPT = "The cat sat on the mat. " * 8
POOLS = ("abcXYZ019 -_.,;:[]{}()'\"\\/", "\x00\x07\x08\x0b\x0c\r\n\t\x1b\x7f\x85\x9b",
         "\x1b]0;title\x07\x1b[2J\x1b[31m", "éüñçß数据実験한국어", "\u202e\u200b\u2028\u2029\ufeff",
         "\U0001f600\U0001f4a9", "\ud800\udfff")
WEIGHTS = (40, 10, 10, 20, 8, 10, 1)  # a lone surrogate now and then


def hostile(rng: random.Random, longest: int = 40) -> str:
    """A random string from the pools; now and then a very long one."""
    n = rng.choice([1, 3, 8, longest, 3000 if rng.random() < 0.2 else 12])
    return "".join(rng.choice(rng.choices(POOLS, WEIGHTS)[0]) for _ in range(n))


def raw_controls(text: str) -> list[str]:
    """Control characters on the terminal, leaving out transformers' own weight-loading bar
    (tqdm redraws it with carriage returns; it holds no user text)."""
    text = re.sub(r"Loading weights:[^\n]*", "", text).replace("\r\n", "\n")
    return [c for c in text if c != "\n" and unicodedata.category(c) in UNPRINTABLE]


def files_under(root):
    return {p for p in root.rglob("*")}


def check_output(result):
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert raw_controls(result.output) == [], result.output


def example(rng: random.Random) -> tuple[list[dict], str, str]:
    ids = list(dict.fromkeys(hostile(rng) for _ in range(2)))
    records = [{"id": i, "prompt": PROMPT} for i in ids]
    if rng.random() < 0.5:
        records[0]["answers" if rng.random() < 0.5 else "answer"] = (
            [hostile(rng, 5) for _ in range(2)] if rng.random() < 0.5 else hostile(rng, 5))
    actions = rng.choice(["full", "full", f"full,{hostile(rng)}", hostile(rng)])
    return records, actions, hostile(rng).replace("/", "_")


@pytest.mark.parametrize("seed", range(6))
def test_hostile_text_never_escapes(tiny_model_dir, tmp_path, seed):
    rng = random.Random(seed)
    records, actions, name = example(rng)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    area = tmp_path / "area"
    area.mkdir()
    out = area / name
    before = files_under(tmp_path)
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--docs", str(docs),
                                 "--actions", actions, "--replicates", "1", "--horizon", "2",
                                 "--out", str(out)])
    check_output(result)
    try:
        inside = out.resolve()
    except (OSError, ValueError):  # a name the file system cannot hold
        inside = None
    for path in files_under(tmp_path) - before:
        assert inside is not None and (path == inside or inside in path.resolve().parents), path
    check_output(runner.invoke(app, ["report", str(area / hostile(rng))]))  # not a store
    if result.exit_code != 0:
        return
    report = runner.invoke(app, ["report", str(out), "--bootstrap", "10"])
    check_output(report)
    try:
        kvdrift.analyze(out, bootstrap=10)
    except ValueError:
        pass
