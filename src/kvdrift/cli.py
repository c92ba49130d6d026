"""The ``kvdrift`` command line: finite-state check, runs, studies and reports."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Measure how KV-cache eviction changes what a language model generates.")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def root() -> None:
    """Measure how KV-cache eviction changes what a language model generates."""


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a user's mistake (ValueError, missing file) into one clear line and exit code 2.

    Set ``KVDRIFT_DEBUG=1`` to see the traceback instead.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, FileNotFoundError, KeyError) as exc:
            if os.environ.get("KVDRIFT_DEBUG"):
                raise
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
            raise typer.Exit(2) from None

    return wrapper


@app.command("finite-state")
@user_errors
def finite_state(
    systems: int = typer.Option(24, help="Number of random binary systems (c = 1..systems)."),
    replicates: int = typer.Option(512, help="Replicates per estimator and system."),
    horizon: int = typer.Option(3, help="Horizon H (generated positions)."),
    seed: int = typer.Option(0, help="Seed for the systems and both estimators."),
    figure: Path = typer.Option(Path("finite-state.png"), help="Where to write the PNG figure."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Reproduce the paper's finite-state check: naive rollouts vs SWRB against exact risk."""
    from kvdrift.finite_study import PAPER, run_finite_study
    from kvdrift.plots.finite import plot_finite_study

    if as_json:
        result = run_finite_study(systems, replicates, horizon, seed)
    else:
        with console.status("") as status:
            def progress(c: int) -> None:
                status.update(f"system {c}/{systems}")

            result = run_finite_study(systems, replicates, horizon, seed, progress=progress)
    path = plot_finite_study(result, figure)
    if as_json:
        print(json.dumps(result.to_json() | {"figure": str(path)}, indent=2))
        return
    table = Table(title=f"Finite-state check: H = {horizon}, {replicates} replicates per estimator")
    for col in ("system", "exact R", "naive mean", "naive SE", "SWRB mean", "SWRB SE",
                "var ratio"):
        table.add_column(col, justify="right")
    for s in result.systems:
        table.add_row(str(s.system), f"{s.exact:.4f}", f"{s.naive_mean:.4f}", f"{s.naive_se:.4f}",
                      f"{s.swrb_mean:.4f}", f"{s.swrb_se:.4f}", f"{s.var_ratio:.1f}")
    console.print(table)
    summary = Table(title="Summary beside the paper")
    for col in ("", "kvdrift", "paper"):
        summary.add_column(col, justify="right")
    rows = [("min variance ratio", result.min_var_ratio, "min_var_ratio", "{:.1f}"),
            ("median variance ratio", result.median_var_ratio, "median_var_ratio", "{:.1f}"),
            ("max variance ratio", result.max_var_ratio, "max_var_ratio", "{:.1f}"),
            ("kernel-pair evaluations", result.cost_ratio, "cost_ratio", "x{:.2f}"),
            ("variance-cost advantage", result.advantage, "advantage", "{:.1f}")]
    for label, ours, key, fmt in rows:
        summary.add_row(label, fmt.format(ours), fmt.format(PAPER[key]))
    console.print(summary)
    console.print(f"figure: {path}")


def main() -> None:
    """Console entry point."""
    app(prog_name="kvdrift")


if __name__ == "__main__":
    sys.exit(main())
