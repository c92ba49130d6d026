"""Terminal tables (rich): a run's per-action table (and its rows as JSON), a study's summary,
the finite-state check, predict and plan, and how to print them. User text goes in as plain
Text, never as console markup."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kvdrift.analysis import registry
from kvdrift.analysis.registry import Quantity
from kvdrift.report.numbers import MISSING, decodes, number_text
from kvdrift.text import printable

if TYPE_CHECKING:
    from kvdrift.analysis.interval import Interval
    from kvdrift.analysis.plan import PlanResult
    from kvdrift.analysis.predict import PredictionResult
    from kvdrift.analysis.readings import SpeculativeResult, TeacherForcedResult
    from kvdrift.analysis.results import ActionResult, StudyAnalysis
    from kvdrift.finite.check import FiniteStudyResult

def user_text(text: object) -> Text:
    """User text (a model, an action, a label) as a plain cell, control characters escaped."""
    return Text(printable(text))


#: Widest page :func:`print_whole` measures a table on (wider than any real table).
_WIDEST = 100_000


def swrb_rate_note(raw: str) -> str:
    """Why an SWRB table may show an impossible-looking C_H, and where its raw value is."""
    return (f"SWRB: C_H = Π_H/E_H is a ratio of two unbiased estimates, so it and its interval "
            f"can leave [0, 1] (sampling noise, not a bug); {raw} keeps the raw value.")


def print_whole(console: Console, renderable: RenderableType) -> None:
    """Print on ``console``; off a terminal (a file, a pipe, a CI log) never cut a cell.

    A terminal gets the usual render at its width. Elsewhere rich would squeeze a table into
    80 columns and truncate names and numbers ("sna…", "68.…"); the table is printed at its
    natural width instead.
    """
    if console.is_terminal:
        console.print(renderable)
        return
    natural = Measurement.get(console, console.options.update_width(_WIDEST), renderable).maximum
    if natural <= console.width:
        console.print(renderable)
        return
    Console(file=console.file, width=natural, color_system=None).print(renderable)


def _percent(value: float, digits: int) -> str:
    text = number_text(value, 100, digits)
    return text if text == MISSING else text + "%"


#: ``kvdrift run --json``'s quantities of the registry, in its key order.
RUN_JSON_QUANTITIES = tuple(registry.quantity(name) for name in (
    "p_diverge", "mean_entry_time", "R", "O", "E", "Pi", "C", "F", "R_minus_F", "R_tv"))

#: The run table's columns of registry quantities: (header, quantity, digits).
RUN_COLUMNS = tuple((header, registry.quantity(name), digits) for header, name, digits in (
    ("P(τ≤{H})", "p_diverge", 1), ("entry time", "mean_entry_time", 1), ("R", "R", 2),
    ("R_TV", "R_tv", 2), ("O_H", "O", 2), ("E_H", "E", 2), ("Pi_H", "Pi", 2), ("C_H", "C", 1),
    ("F", "F", 2)))

#: The draft length of the run's "tokens per round" (one of the readings' gammas).
RUN_DRAFT_LENGTH = 4


def _estimate(action: ActionResult, q: Quantity) -> float:
    """The action's point estimate of ``q``; NaN where the analysis does not have it."""
    iv = action.scalars.get(q.name)
    return float("nan") if iv is None else iv.estimate


def _entry(entries: Sequence[TeacherForcedResult | SpeculativeResult], action: ActionResult):
    """The reading of ``action`` among ``entries`` (one per model x action), or None."""
    return next((x for x in entries if (x.model, x.action) == (action.model, action.action)),
                None)


def _readings(analysis: StudyAnalysis, action: ActionResult) -> dict[str, float]:
    """Mean KL, speculative acceptance and tokens per round at :data:`RUN_DRAFT_LENGTH` of
    ``action`` (its entries in ``teacher_forced`` and ``speculative``); NaN where not
    measured (SWRB, or records without the teacher-forced columns)."""
    nan = float("nan")
    forced = _entry(analysis.teacher_forced, action)
    spec = _entry(analysis.speculative, action)
    return {"kl": nan if forced is None else forced.numbers.kl.estimate,
            "acceptance": nan if spec is None else spec.numbers.acceptance.estimate,
            "tokens_per_round": nan if spec is None
            else spec.numbers.tokens_per_round[RUN_DRAFT_LENGTH].estimate}


def run_rows(analysis: StudyAnalysis) -> list[dict[str, object]]:
    """``kvdrift run --json``: per (model, action) of the analysis, its name, documents, the
    point estimates of :data:`RUN_JSON_QUANTITIES`, the readings along X and Q's cache size
    (NaN, written null, where not measured)."""
    return [{"model": a.model, "action": a.action, "documents": a.documents}
            | {q.name: _estimate(a, q) for q in RUN_JSON_QUANTITIES}
            | _readings(analysis, a) | {"kv_bytes": a.kv_bytes, "kv_fraction": a.kv_fraction,
                                        "kv_fraction_generation": a.kv_fraction_generation}
            for a in analysis.actions]


def _point(q: Quantity, value: float, digits: int) -> str:
    """A point estimate in its quantity's unit (a fraction of positions: with "%")."""
    return _percent(value, digits) if q.unit == "%" else number_text(value, q.scale, digits)


def kl_table(stats: list) -> Table:
    """llama-perplexity's KL-divergence statistics per action
    (:mod:`kvdrift.analysis.kl_statistics`): mean ± se, percentiles, same top token."""
    from kvdrift.analysis.kl_statistics import kl_rows

    rows = kl_rows(stats)
    table = Table(title="Teacher-forced along P's text, as llama-perplexity --kl-divergence")
    shown = ["action", "positions", "mean KLD", "± (mean)", "max KLD", "99% KLD", "90% KLD",
             "50% KLD", "same top"]
    for name in shown:
        table.add_column(name, justify="left" if name == "action" else "right")
    for row in rows:
        table.add_row(*[_kl_cell(name, row[name]) for name in shown])
    return table


def _kl_cell(name: str, value) -> str:
    if name == "action":
        return printable(str(value))
    if name == "positions":
        return f"{int(value):,}"
    if name == "same top":
        return f"{100 * float(value):.1f}%"
    return f"{float(value):.4f}"


def run_table(analysis: StudyAnalysis) -> Table:
    """One row per (model, action) of a run's analysis, point estimates; "—" where not
    measured.

    SWRB does not follow the fixed-history path, so its F (and the readings along X: mean KL,
    speculative acceptance, tokens per round at draft length 4) is "—"; a mean entry time
    needs at least one divergence.
    """
    from kvdrift.analysis import legend

    swrb = not analysis.meta.records.complete_branches
    H = analysis.meta.horizon
    notes = legend.lines(["p_diverge", "F", *(name for _, name in legend.READINGS)], H)
    if swrb:
        notes.append(swrb_rate_note("--json"))
    table = Table(title="Per action (documents weighted equally within strata, strata equally)",
                  caption=Text("\n".join(notes)), caption_justify="left")
    for col in ("model", "action", "docs", *(header.format(H=H) for header, _, _ in RUN_COLUMNS),
                *(header for header, _ in legend.READINGS), "kv_fraction"):
        table.add_column(col, justify="right")
    for a in analysis.actions:
        readings = _readings(analysis, a)
        table.add_row(user_text(a.model), user_text(a.action), str(a.documents),
                      *(_point(q, _estimate(a, q), digits) for _, q, digits in RUN_COLUMNS),
                      number_text(readings["kl"], digits=3),
                      _percent(readings["acceptance"], 1),
                      number_text(readings["tokens_per_round"], digits=2),
                      number_text(a.kv_fraction, digits=3))
    return table


def _cell(q: Quantity, interval: Interval | None) -> Text:
    """The estimate, and below it the interval (dim): two short lines keep the table narrow."""
    if interval is None or not interval.defined:
        return Text(MISSING)
    text = Text(number_text(interval.estimate, q.scale, 1))
    lo, hi = interval.lo, interval.hi
    if math.isfinite(lo) and math.isfinite(hi):
        text.append(f"\n[{number_text(lo, q.scale, 1)}, {number_text(hi, q.scale, 1)}]",
                    style="dim")
    return text


def summary_table(analysis: StudyAnalysis) -> Table:
    """One row per (model, action): P(tau<=H), R, E_H, C_H, R-F, B(a) with their intervals,
    and ``kv_fraction`` when some action has it (and ``kv_fraction_generation``, "over H",
    when some action compresses during generation).

    Percent for fractions, pp for differences, one decimal. Each cell is the estimate over its
    ``[lo, hi]``; cells are plain :class:`rich.text.Text`, so brackets are never read as markup.
    """
    H = analysis.meta.horizon
    quantities = [q for q in registry.QUANTITIES if q.summary]
    estimator = analysis.meta.estimator
    from kvdrift.analysis import legend

    caption = ("estimate over [lo, hi]; %: of positions (P(τ≤H): of trajectories); "
               "pp: percentage points\n" + "\n".join(
                   legend.lines([q.name for q in quantities if q.name in ("p_diverge",
                                                                          "R_minus_F", "B")], H)))
    if not analysis.meta.records.complete_branches:
        caption += "\n" + swrb_rate_note("analysis.json")
    table = Table(
        title="kvdrift study summary" + (f" ({estimator})" if estimator else ""),
        caption=Text(caption), caption_justify="left",
        header_style="bold",
    )
    table.add_column("model", style="cyan", overflow="fold")
    table.add_column("action", style="bold", overflow="fold")
    memory = any(math.isfinite(a.kv_fraction) for a in analysis.actions)
    if memory:
        table.add_column("kv_fraction", justify="right")
    over_h = decodes(analysis)
    if over_h:
        table.add_column("kv_fraction\nover H", justify="right")
    for q in quantities:
        table.add_column(f"{q.text.format(H=H)}\n({q.unit})", justify="right")
    previous = None
    for a in analysis.actions:
        model = a.model
        if previous is not None and model != previous:
            table.add_section()
        memory_cells = [Text(number_text(a.kv_fraction, digits=3))] if memory else []
        if over_h:
            memory_cells.append(Text(number_text(a.kv_fraction_generation, digits=3)))
        table.add_row(user_text(model if model != previous else ""), user_text(a.action),
                      *memory_cells, *(_cell(q, a.scalars.get(q.name)) for q in quantities))
        previous = model
    return table


def _right_table(title: str, columns: Sequence[str]) -> Table:
    table = Table(title=user_text(title))
    for col in columns:
        table.add_column(col, justify="right")
    return table


def finite_state_tables(result: FiniteStudyResult) -> tuple[Table, Table, list[str]]:
    """The finite-state check: per-system table, summary beside the paper, footnotes."""
    from kvdrift.finite.check import PAPER

    horizon, replicates = result.horizon, result.replicates
    table = _right_table(f"Finite-state check: H = {horizon}, {replicates} replicates per "
                         "estimator", ("system", "exact R", "naive mean", "naive SE",
                                       "SWRB mean", "SWRB SE", "var ratio"))
    for s in result.systems:
        table.add_row(str(s.system), f"{s.exact:.4f}", f"{s.naive_mean:.4f}", f"{s.naive_se:.4f}",
                      f"{s.swrb_mean:.4f}", f"{s.swrb_se:.4f}",
                      f"{s.var_ratio:.1f}" if s.informative else "undefined*")
    summary = _right_table("Summary beside the paper", ("", "kvdrift", "paper"))
    summary.add_row("informative systems", f"{result.informative} of {len(result.systems)}",
                    "24 of 24")
    for label, ours, key, fmt in (
            ("min variance ratio", result.min_var_ratio, "min_var_ratio", "{:.1f}"),
            ("median variance ratio", result.median_var_ratio, "median_var_ratio", "{:.1f}"),
            ("max variance ratio", result.max_var_ratio, "max_var_ratio", "{:.1f}"),
            ("kernel-pair evaluations", result.cost_ratio, "cost_ratio", "x{:.2f}"),
            ("variance-cost advantage", result.advantage, "advantage", "{:.1f}")):
        summary.add_row(label, fmt.format(ours), fmt.format(PAPER[key]))
    notes = [f"* system {s.system}: variance ratio undefined: {s.var_ratio_undefined}; left out "
             "of min / median / max." for s in result.systems if not s.informative]
    return table, summary, notes


def _pp(iv: Interval) -> str:
    return f"{100 * iv.estimate:+.2f} [{100 * iv.lo:+.2f}, {100 * iv.hi:+.2f}]"


def prediction_tables(result: PredictionResult, margin: float) -> tuple[Table, Table, list[str]]:
    """``kvdrift predict``: the calibrated error per observation, the supporting contrasts,
    and the notes (model names and labels are printed literally)."""
    level = 100 * (1 - result.alpha_adjusted)
    what = "rollout TV" if result.target == "tv" else "token mismatch"
    table = _right_table(
        f"Prediction of R({result.contrast.replace(' - ', ') - R(')}) ({what}), percentage "
        f"points; intervals at {level:.2f}% ({result.cells} cells), margin +-{100 * margin:g} pp",
        ("model", "observation", "dev/eval docs", "selected", "CV MSE (pp^2)",
         "error [interval]", "decision", "MAE", "RMSE"))
    support = _right_table("Uncalibrated supporting contrasts on evaluation documents (pp; "
                           f"pointwise {100 * (1 - result.alpha):g}% intervals)",
                           ("model", "observation", "full-horizon gap", "observed gap",
                            "full minus observed"))
    for m in result.models:
        docs = f"{m.development_documents}/{m.evaluation_documents}"
        for o in m.observations:
            table.add_row(user_text(m.model), user_text(o.label), docs, user_text(o.selected),
                          f"{1e4 * o.cv_mse[o.selected]:.2f}", _pp(o.error), user_text(o.decision),
                          _with_documents(o.mae, o.mae_documents),
                          _with_documents(o.rmse, o.rmse_documents))
            support.add_row(user_text(m.model), user_text(o.label),
                            *(_pp(iv) for iv in o.supporting.values()))
    notes = [f"{m.model}: note: {note}." for m in result.models for note in m.notes]
    notes.append("MAE and RMSE (pp) weigh strata equally, as the error estimate does; in "
                 "parentheses where it differs, with every document weighted equally.")
    return table, support, notes


def _with_documents(strata: float, documents: float) -> str:
    """``"4.09"``, or ``"4.09 (3.87)"`` when the document-weighted value differs."""
    text = f"{100 * strata:.2f}"
    other = f"{100 * documents:.2f}"
    return text if other in (text, "nan") else f"{text} ({other})"


def plan_table(result: PlanResult, target: str, halfwidth: float,
               alpha: float) -> tuple[Table, list[str]]:
    """``kvdrift plan``: the plan per model, then notes and the rollout-vs-SWRB verdicts."""
    level = f"{100 * result.level:.4g}%"
    if result.endpoints > 1:
        level += f" (Bonferroni: alpha {alpha:g} over {result.endpoints} endpoints)"
    table = _right_table(
        f"Plan for {target}: half-width {halfwidth:g} at {level} (documents "
        "weighted equally within strata)",
        ("model", "estimator", "strata", "between var", "within var", "s/doc", "s/replicate",
         "now: docs/stratum, K -> half-width", "plan: docs/stratum, K -> half-width",
         "plan cost"))
    lines = []
    for m in result.models:
        v, now, rec = m.variance, m.current, m.recommended
        table.add_row(user_text(m.model), m.estimator, str(v.strata), f"{v.between:.3g}",
                      f"{v.within:.3g}", f"{m.setup_seconds:.1f}", f"{m.replicate_seconds:.1f}",
                      f"{now.documents_per_stratum:g}, {now.replicates} -> {now.halfwidth:.4f}",
                      f"{rec.documents_per_stratum}, {rec.replicates} -> {rec.halfwidth:.4f}",
                      f"{rec.seconds / 3600:.2f} h")
        lines += [f"{m.model}: note: {note}." for note in m.notes]
        c = m.comparison
        if c.assumption is None:
            lines.append(f"{m.model}: rollouts ({c.reason}).")
            continue
        evals, plans, ratio = c.evaluations_per_replicate, c.plans, c.break_even_variance_ratio
        when = ("even with equal variance" if ratio == 1.0 else
                f"only if its within-document variance is {ratio:.2f}x smaller or more"
                if ratio is not None else "at no variance ratio (documents dominate the cost)")
        lines.append(
            f"{m.model}: {c.cheaper} is cheaper under equal variance "
            f"(rollout {plans['rollout'].seconds / 3600:.2f} h, "
            f"SWRB {plans['swrb'].seconds / 3600:.2f} h; kernel-pair evaluations per "
            f"replicate {evals['rollout']:.1f} vs {evals['swrb']:.1f}); SWRB wins {when}. "
            f"Assumption: {c.assumption}.")
    return table, lines
