"""Which recorded values must be finite, and where a stored file breaks that.

kvdrift refuses to store a unit whose estimator met a non-finite probability
(:class:`kvdrift.run.runner.NonFiniteUnit`), but stores written before that rule may hold NaN
or infinite values where a number belongs (a TV ``delta``, a replicate's ``risk_tv``). The
analysis must never compute from what is left around them (a mean that skips NaN reports
S99 = 0.0 where the truth is 0.125), so a store's reader names every such column of every
unit (:func:`nonfinite_counts`) and refuses it until ``--recompute`` recomputes the unit.

NaN is a recorded value only where the schema says so (:mod:`.schema`): SWRB rows have no
``delta``, ``f``, ``risk_tv`` or ``fixed_risk``; the teacher-forced columns (``kl`` may be
infinite), ``lost_mass`` without a divergence and the task scores are left alone.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from kvdrift.records.schema import CAPACITY, MEMORY_COLUMNS, OBSERVED, TERM_COLUMNS

#: Columns finite in every row, by record kind.
ALWAYS = {"steps": ("scan_tv", "weight"),
          "replicates": (*(c for c in TERM_COLUMNS if c != "fixed_risk"), OBSERVED.name,
                         CAPACITY.name, *MEMORY_COLUMNS)}
#: Columns finite in the rows of an estimator that follows both branches (rollouts).
COMPLETE_BRANCHES = {"steps": ("delta", "f"), "replicates": ("risk_tv", "fixed_risk")}
_NAN_ALLOWED_FOR = "swrb"  # the estimator whose rows hold NaN in COMPLETE_BRANCHES columns


def _nonfinite(column: pa.ChunkedArray, rows: pa.ChunkedArray | None, nulls: bool) -> int:
    """Values of ``column`` (restricted to ``rows`` where given) that are NaN or infinite, and
    (``nulls``: where the rows must hold a number) null: a legacy store with null ``delta``
    reported S99 = 0.125 where the truth was 0.1875 (issue 52), as NaN once did."""
    if pa.types.is_list(column.type):
        if rows is not None:
            column = column.filter(rows)
        missing = column.null_count if nulls else 0
        column = pa.chunked_array([pc.list_flatten(chunk) for chunk in column.chunks],
                                  type=column.type.value_type)
        return missing + _nonfinite(column, None, nulls)
    if pa.types.is_null(column.type):  # every value null: no number at all
        bad = pc.is_null(column) if nulls else pc.is_valid(column)
    elif not pa.types.is_floating(column.type):
        return column.null_count if nulls and rows is None else 0
    else:
        bad = pc.invert(pc.is_finite(column))
        bad = pc.fill_null(bad, nulls)
    if rows is not None:
        bad = pc.and_(bad, rows)
    return int(pc.sum(bad).as_py() or 0)


def nonfinite_counts(kind: str, table: pa.Table,
                     estimator: pa.ChunkedArray | None = None) -> dict[str, int]:
    """``{column: count}`` of the NaN, infinite or null values where ``kind``'s records
    (``"steps"`` or ``"replicates"``) hold numbers; ``estimator``: the rows' estimator
    column where ``table`` was read without it (else rows of unknown estimator are checked as
    rollouts, and nulls in SWRB's own step columns are left alone)."""
    if estimator is None and "estimator" in table.column_names:
        estimator = table.column("estimator")
    complete = None if estimator is None else pc.not_equal(estimator, _NAN_ALLOWED_FOR)
    scans = None if estimator is None else pc.equal(estimator, _NAN_ALLOWED_FOR)
    # (columns, the rows they hold numbers in, whether a null there is counted)
    always = ((ALWAYS[kind], scans, scans is not None) if kind == "steps"  # SWRB's scan
              else (ALWAYS[kind], None, True))
    counts = {}
    for names, rows, nulls in (always, (COMPLETE_BRANCHES[kind], complete, True)):
        for name in names:
            if name in table.column_names:
                found = _nonfinite(table.column(name), rows, nulls)
                if found:
                    counts[name] = found
    return counts


def counts_text(counts: dict[str, int]) -> str:
    """``"delta: 3 values, risk_tv: 1 value"``."""
    return ", ".join(f"{name}: {n} value{'' if n == 1 else 's'}" for name, n in counts.items())
