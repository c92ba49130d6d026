"""A long generation folded around what matters (examples/folding.py), as ``kvdrift show`` and
the report's Examples print it: the start, tau with its context, each compression, the end."""

from __future__ import annotations

import re

from kvdrift.examples.folding import AFTER, BEFORE, FOLD_ABOVE, HEAD, TAIL, Folded, fold
from kvdrift.examples.selection import Example
from kvdrift.examples.views import ExampleView, Position
from kvdrift.report.example_text import COMPRESSION_MARK, DIVERGENCE_MARK, example_text
from kvdrift.report.page import generations


def positions(H: int, tau: int) -> tuple[Position, ...]:
    """Tokens agree before tau (0: never), then tau and every third position differ."""
    def differs(t: int) -> bool:
        return 0 < tau <= t and (t % 3 == 0 or t == tau)

    return tuple(Position(t, f"x{t}", f"y{t}" if differs(t) else f"x{t}", differs(t), 0.5)
                 for t in range(1, H + 1))


def test_a_long_generation_keeps_start_divergence_compressions_end_and_counts_the_rest():
    H, tau, cuts = 4096, 300, (66, 130, 194, 3010)
    pos = positions(H, tau)
    f = fold(pos, tau, cuts)
    shown = [p.t for p in f.items if isinstance(p, Position)]
    folds = [p for p in f.items if isinstance(p, Folded)]
    want = (set(range(1, HEAD + 1)) | set(range(H - TAIL + 1, H + 1))
            | set(range(tau - BEFORE, tau + AFTER))
            | {t + d for t in cuts for d in (-1, 0, 1)})
    assert shown == sorted(want)
    # every position is shown or folded, once, in order
    covered = []
    for item in f.items:
        covered += [item.t] if isinstance(item, Position) else list(range(item.first,
                                                                           item.last + 1))
    assert covered == list(range(1, H + 1))
    assert f.folded == sum(x.count for x in folds) == H - len(shown) and f.total == H
    for x in folds:  # each fold counts its own mismatches and compressions
        inside = [p for p in pos if x.first <= p.t <= x.last]
        assert x.mismatches == sum(p.mismatch for p in inside) and x.compressions == 0
    assert f.summary().startswith(f"folded {H - len(shown):,} of 4,096 positions")


def test_short_generations_are_not_folded_and_dense_compressions_are_counted():
    pos = positions(FOLD_ABOVE, 5)
    assert fold(pos, 5, (3, 4)).items == pos and fold(pos, 5, ()).summary() is None
    long = positions(1024, 0)  # never diverged; a compression every step from 10 on
    f = fold(long, 0, tuple(range(10, 1025)))
    assert [p.t for p in f.items if isinstance(p, Position)] == [*range(1, 9),
                                                                   *range(1017, 1025)]
    (only,) = [x for x in f.items if isinstance(x, Folded)]
    assert (only.first, only.last, only.count, only.compressions) == (9, 1016, 1008, 1007)
    assert only.summary() == ("… 1008 positions folded (t = 9–1016; 0 mismatches, "
                              "1007 compressions) …")


def view(H: int, tau: int, cuts: tuple[int, ...]) -> ExampleView:
    return ExampleView(Example("m", "d0", "decoding-knorm:interval=64,target=256", 0, tau,
                               "earliest"), "rollout", H, 0.3, 0.2, positions(H, tau),
                       compressions=cuts)


def test_show_prints_the_folded_rows_with_marks():
    text = example_text(view(2048, 700, (66, 130))).plain
    lines = text.splitlines()
    rows = [line for line in lines if re.match(r"^(τ▶|  )[✂ ] +\d+  '", line)]
    assert [int(line[4:8]) for line in rows if line[2] == COMPRESSION_MARK] == [66, 130]
    assert [int(line[4:8]) for line in rows if line.startswith(DIVERGENCE_MARK)] == [700]
    assert any("positions folded (t = " in line for line in lines)
    assert "folded " in text and "of 2,048 positions" in text
    assert f"{COMPRESSION_MARK}: the first position read from Q's cache after a " in text
    # P's and Q's text stay whole, wrapped at 80 columns (a text without spaces folds)
    p, q = (next(i for i, line in enumerate(lines) if line.startswith(f"{n}: ")) for n in "PQ")
    assert all(len(line) <= 80 for line in lines[p:])
    assert "".join(line[3:] for line in lines[p:q]) == "".join(
        p.x_text for p in positions(2048, 700))


def test_show_of_a_view_without_compressions_keeps_its_layout():
    lines = example_text(view(5, 3, ())).plain.splitlines()
    rows = [line for line in lines if re.match(r"^(τ▶|  ) +\d+  '", line)]
    assert [int(line[3:6]) for line in rows] == [1, 2, 3, 4, 5]
    assert COMPRESSION_MARK not in "".join(lines)


def test_the_report_folds_and_marks_the_same_way():
    html = generations(view(2048, 700, (66, 130)))  # P's side and Q's side
    assert html.count('<span class="cut"') == 2 * 2 and html.count('class="folded"') >= 3
    assert "of 2,048 positions" in html
    assert html.count('class="tok') == 2 * len(
        [p for p in fold(positions(2048, 700), 700, (66, 130)).items
         if isinstance(p, Position)])


def test_show_of_a_real_run_marks_the_recorded_compressions(tiny_model_dir, tmp_path):
    """A decoding-time press on the tiny model over 120 positions: the records hold the
    compressions derived from its settings, and ``show`` folds the run and marks each."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from kvdrift.cli import app
    from kvdrift.data import Document, write_jsonl

    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="d0", prompt="The cat sat on the mat. " * 6)], docs)
    out = tmp_path / "run"
    runner = CliRunner()
    spec = "decoding-knorm:interval=40,target=48"
    made = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--docs", str(docs),
                               "--actions", spec, "--replicates", "1", "--horizon", "120",
                               "--out", str(out)])
    assert made.exit_code == 0, made.output
    reps = pq.read_table(out / "replicates").to_pandas()
    # compressions after 40 and 80 generated tokens (more than 48 entries live by then) first
    # show at positions 42 and 82; the one after 120 tokens falls beyond H
    assert reps["compression_positions"].iloc[0].tolist() == [42, 82]
    assert 0 < reps["kv_fraction_generation"].iloc[0] < reps["kv_fraction"].iloc[0] == 1
    shown = runner.invoke(app, ["show", str(out), "--prompt-tokens", "0"])
    assert shown.exit_code == 0, shown.output
    rows = [line for line in shown.stdout.splitlines() if re.match(r"^(τ▶|  )[✂ ] +\d+  '", line)]
    assert [int(line[4:8]) for line in rows if line[2] == COMPRESSION_MARK] == [42, 82]
    assert "of 120 positions" in shown.stdout and "positions folded (t = " in shown.stdout
    # a random model's tokens (any script, any byte) still fit 80 columns on every line
    from rich.cells import cell_len

    assert max(cell_len(line) for line in shown.stdout.splitlines()) <= 80
