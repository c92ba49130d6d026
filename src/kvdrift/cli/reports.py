"""``kvdrift report``: analyse a run or study directory, write the HTML report."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from kvdrift.cli.common import console, notice, say, user_errors
from kvdrift.text import printable


def write_report(store_dir: Path, out: Path | None, bootstrap: int | None = None,
                 alpha: float | None = None, wait: bool = False):
    """Analyse a store with its saved analysis options (``bootstrap``/``alpha`` override);
    a partial store (being written, or units missing) is said on stderr."""
    from kvdrift.directory import StudyDirectory
    from kvdrift.output import OutputDir
    from kvdrift.report import write_report as write
    from kvdrift.report.sections.examples import examples_section

    status = (f"waiting for the run writing {escape(printable(store_dir))}" if wait
              else "analysing (bootstrap over documents)")
    with console.status(status):
        analysis = StudyDirectory(store_dir).analyze(bootstrap, alpha, wait=wait)
    if "partial" in analysis.meta.run:
        notice(analysis.meta.notes[0])
    with console.status("writing the report"):
        examples = examples_section(StudyDirectory(store_dir))
        folder = OutputDir(out or store_dir / "report", marker="report")  # held while written
        write(analysis, folder, examples=examples)
    return analysis, folder / "report.html"


def write_and_summarize(store_dir: Path, out: Path | None, bootstrap: int | None = None,
                        alpha: float | None = None, wait: bool = False) -> Path:
    """Write the report, then print the summary table and where the report is."""
    from kvdrift.report import summary_table
    from kvdrift.report.terminal import print_whole

    analysis, path = write_report(store_dir, out, bootstrap, alpha, wait)
    print_whole(console, summary_table(analysis))
    say(f"report: {path}")
    return path


@user_errors
def report(
    directory: Path = typer.Argument(..., help="A run or study directory."),
    out: str | None = typer.Option(None, help="Report directory (default: DIR/report)."),
    bootstrap: int | None = typer.Option(None, help="Bootstrap draws (default: the study's)."),
    alpha: float | None = typer.Option(None, help="Interval level alpha (default: the study's)."),
    as_json: bool = typer.Option(False, "--json", help="Also print every number as JSON."),
    wait: bool = typer.Option(False, "--wait", help="If a run is writing DIR, wait for it to "
                              "finish (else the report is partial, and says so)."),
) -> None:
    """Analyse a run or study directory and write an HTML report with figures."""
    from kvdrift.analysis.options import check_overrides
    from kvdrift.run.outdir import check_report_dir
    from kvdrift.run.run_file import check_store_dir

    check_store_dir(directory)  # what DIR is comes first (a frontier: its report)
    check_overrides(bootstrap, alpha, "--bootstrap", "--alpha")  # before pandas loads
    out = check_report_dir(directory / "report" if out is None else out)  # before the analysis
    if as_json:
        _, path = write_report(directory, out, bootstrap, alpha, wait)
        print(path.folder.read_bytes("analysis.json").decode("utf-8"))
        return
    write_and_summarize(directory, out, bootstrap, alpha, wait)
