"""``kvdrift report``: analyse a run or study directory, write the HTML report."""

from __future__ import annotations

from pathlib import Path

import typer

from kvdrift.cli.common import console, say, user_errors


def write_report(store_dir: Path, out: Path | None, bootstrap: int | None = None,
                 alpha: float | None = None):
    """Analyse a store with its saved analysis options (``bootstrap``/``alpha`` override)."""
    from kvdrift.analysis.directory import analyze_directory
    from kvdrift.report import write_report as write

    with console.status("analysing (bootstrap over documents)"):
        analysis = analyze_directory(store_dir, bootstrap, alpha)
    with console.status("writing the report"):
        path = write(analysis, out or store_dir / "report")
    return analysis, path


def write_and_summarize(store_dir: Path, out: Path | None, bootstrap: int | None = None,
                        alpha: float | None = None) -> Path:
    """Write the report, then print the summary table and where the report is."""
    from kvdrift.report import summary_table
    from kvdrift.report.terminal import print_whole

    analysis, path = write_report(store_dir, out, bootstrap, alpha)
    print_whole(console, summary_table(analysis))
    say(f"report: {path}")
    return path


@user_errors
def report(
    directory: Path = typer.Argument(..., help="A run or study directory."),
    out: Path | None = typer.Option(None, help="Report directory (default: DIR/report)."),
    bootstrap: int | None = typer.Option(None, help="Bootstrap draws (default: the study's)."),
    alpha: float | None = typer.Option(None, help="Interval level alpha (default: the study's)."),
    as_json: bool = typer.Option(False, "--json", help="Also print every number as JSON."),
) -> None:
    """Analyse a run or study directory and write an HTML report with figures."""
    if as_json:
        _, path = write_report(directory, out, bootstrap, alpha)
        print((path.parent / "analysis.json").read_text())
        return
    write_and_summarize(directory, out, bootstrap, alpha)
