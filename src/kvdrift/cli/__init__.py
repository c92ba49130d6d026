"""The ``kvdrift`` command line. Each command lives in a small module that parses its
arguments, calls the library and prints; tables come from :mod:`kvdrift.report.terminal`."""

from __future__ import annotations

import sys

import typer

from kvdrift.cli.calibration import plan, predict
from kvdrift.cli.finite_state import finite_state
from kvdrift.cli.frontier import frontier
from kvdrift.cli.reports import report
from kvdrift.cli.runs import run, study
from kvdrift.cli.show import HELP as SHOW_HELP
from kvdrift.cli.show import SHORT_HELP as SHOW_SHORT_HELP
from kvdrift.cli.show import show

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Measure how KV-cache compression changes what a language model "
                       "generates.")


@app.callback()
def root() -> None:
    """Measure how KV-cache compression changes what a language model generates."""


def actions_list() -> None:
    """List every action: named ones, kvpress press families, scorers, presses not offered."""
    from kvdrift.lm.actions.spec import actions_help

    print(actions_help())


app.command("finite-state")(finite_state)
app.command("actions")(actions_list)
app.command("run")(run)
app.command("report")(report)
app.command("show", help=SHOW_HELP, short_help=SHOW_SHORT_HELP)(show)
app.command("study")(study)
app.command("predict")(predict)
app.command("plan")(plan)
app.command("frontier")(frontier)


def main() -> None:
    """Console entry point."""
    app(prog_name="kvdrift")


__all__ = ["app", "main"]

if __name__ == "__main__":
    sys.exit(main())
