"""``kvdrift predict`` and ``kvdrift plan``: calibrate short observations, size studies."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from kvdrift.cli.common import console, say, strict_json, user_errors
from kvdrift.text import printable


@user_errors
def predict(
    dev_dir: Path = typer.Argument(..., metavar="DEV_DIR", help="Development run or study."),
    eval_dir: Path = typer.Argument(..., metavar="EVAL_DIR", help="Evaluation run or study "
                                    "(same models and actions, other documents)."),
    contrast: str = typer.Option(..., help="The contrast 'R(a) - R(b)', or 'a - b' for short."),
    window: int = typer.Option(32, help="Observed positions 1..W (at most H)."),
    margin: float = typer.Option(0.02, help="Equivalence margin on the error (0.02 = 2 pp)."),
    alpha: float = typer.Option(0.05, help="Family alpha, split over models x observations."),
    bootstrap: int = typer.Option(10000, help="Document bootstrap draws (the paper's "
                                  "confirmatory 10,000)."),
    seed: int = typer.Option(0, help="Seed of the bootstrap."),
    target: str = typer.Option("tv", help="Full-horizon target: tv (rollout TV, the paper's) "
                               "or tokens (token-mismatch fraction)."),
    report_path: str | None = typer.Option(None, "--report", help="Also write the paper's "
                                           "Table 4 as an HTML page here (a file name)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Predict a full-horizon contrast from short observations, calibrated on development
    documents and checked on evaluation documents."""
    from kvdrift import checks, limits
    from kvdrift.run.outdir import check_file_path
    from kvdrift.run.run_file import check_store_dir

    limits.seed(seed, "--seed")  # what is checked without the records, before pandas loads
    checks.integer(window, "--window", 1)
    checks.number(margin, "--margin", 0, open_lo=True)
    checks.number(alpha, "--alpha", 0, 1, open_lo=True, open_hi=True, rule="within (0, 1)")
    limits.count(bootstrap, "--bootstrap", limits.MAX_BOOTSTRAP, 0)
    checks.choice(target, "--target", ("tv", "tokens"))
    if report_path is not None:
        report_path = check_file_path(report_path, "--report")  # before any work
    check_store_dir(dev_dir)
    check_store_dir(eval_dir)
    from kvdrift.directory import StudyDirectory
    from kvdrift.report.terminal import prediction_tables, print_whole

    with console.status("reading records") as status:
        result = StudyDirectory(dev_dir).predict(
            StudyDirectory(eval_dir), contrast, window=window, margin=margin, alpha=alpha,
            draws=bootstrap, seed=seed, target=target,
            on_cell=lambda m, o: status.update(escape(printable(f"{m} · {o}"))))
    if report_path is not None:
        from kvdrift.report.paper import write_prediction_report

        write_prediction_report(result, report_path)
    if as_json:
        print(strict_json(result.to_json()))
        return
    table, support, notes = prediction_tables(result, margin)
    print_whole(console, table)
    print_whole(console, support)
    for line in notes:
        say(line)


@user_errors
def plan(
    dev_dir: Path = typer.Argument(..., metavar="DEV_DIR", help="Development run or study."),
    target: str = typer.Option(..., help="Quantity or contrast, e.g. 'R(a) - R(b)' or "
                               "'S99(a)'."),
    halfwidth: float = typer.Option(..., help="Target interval half-width (0.01 = 1 pp)."),
    alpha: float = typer.Option(0.05, help="Interval level alpha (family alpha with "
                                "--endpoints)."),
    endpoints: int = typer.Option(1, help="Prespecified endpoints sharing alpha: the "
                                  "interval is at 1 - alpha/k (Bonferroni)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Recommend documents per stratum and K for a target half-width, from a development
    run's measured variance and cost, and say whether rollouts or SWRB is cheaper."""
    from kvdrift import checks, limits
    from kvdrift.run.run_file import check_store_dir

    limits.endpoints(endpoints, "--endpoints")  # what is checked without the records,
    checks.number(alpha, "--alpha", 0, 1, open_lo=True, open_hi=True, rule="within (0, 1)")
    limits.plan_halfwidth(halfwidth)
    check_store_dir(dev_dir)  # before pandas loads
    from kvdrift.directory import StudyDirectory
    from kvdrift.report.terminal import plan_table, print_whole

    result = StudyDirectory(dev_dir).plan(target, halfwidth, alpha, endpoints)
    if as_json:
        print(strict_json(result.to_json()))
        return
    table, lines = plan_table(result, target, halfwidth, alpha)
    print_whole(console, table)
    for line in lines:
        say(line)
