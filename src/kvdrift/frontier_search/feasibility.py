"""Whether a frontier can certify anything at all, before any model is loaded.

Pure arithmetic on the bet (``betting.py``): with every value at the best end of the measure's
range, the certifying bound of a budget reaches the tolerance after a fixed number of rounds;
no data can do it sooner. If the replicates cap is below that number, the search would run for
minutes and certify nothing, so it is refused in one line that gives the number. It counts
what the search does: the search cuts its last look at the cap (no bound uses more), and only
documents that can give values make a round (:func:`gives_values`).
"""

from __future__ import annotations

from kvdrift.frontier_search.betting import BET, Bet, rounds_to_certify
from kvdrift.frontier_search.measure import Measure

#: The most replicates per document the check looks for (beyond it: "more than this").
LOOK_LIMIT = 100_000


def gives_values(document: object, measure: Measure) -> bool:
    """Whether a document (a :class:`~kvdrift.data.document.Document` or a documents file's
    record, a dict) can give values of ``measure``: a measure read from task scores needs an
    answer to score against; a document without one gives no value and adds nothing to a
    round, so it is not counted."""
    if not measure.kind.needs_answers:
        return True
    answer = (document.get("answer") if isinstance(document, dict)
              else getattr(document, "answer", None))
    return answer is not None


def fewest_replicates(measure: Measure, documents: int, alpha: float, families: int,
                      bet: Bet = BET) -> int | None:
    """The fewest replicates per document after which any budget could be certified (every
    value at the best end of the range) at the family's level ``alpha / families``; None if
    more than :data:`LOOK_LIMIT`. 0 for a measure that is never certified (unbounded)."""
    if not measure.certifiable:
        return 0
    low, high = measure.range
    level = alpha / families
    if measure.op == "<=":
        return rounds_to_certify(documents, level, measure.tolerance, low, high, LOOK_LIMIT,
                                 bet)
    return rounds_to_certify(documents, level, -measure.tolerance, -high, -low, LOOK_LIMIT,
                             bet)


def check_feasible(measure: Measure, documents: int, alpha: float, families: int,
                   max_replicates: int, bet: Bet = BET) -> None:
    """Refuse a search whose cap is below :func:`fewest_replicates`, in one line with the
    number and how to change the settings."""
    need = fewest_replicates(measure, documents, alpha, families, bet)
    if need is not None and need <= max_replicates:
        return
    what = f"more than {LOOK_LIMIT}" if need is None else str(need)
    best = measure.range[0] if measure.op == "<=" else measure.range[1]
    raise ValueError(
        f"no budget can be certified with --max-replicates {max_replicates}: {measure} at "
        f"alpha {alpha:g} over {families} families and {documents} documents needs {what} "
        f"replicates per document even if every value is {best:g}; raise --max-replicates"
        + ("" if need is None else f" to {need}") + ", or loosen the tolerance, add "
        "documents, raise --alpha or search fewer families")
