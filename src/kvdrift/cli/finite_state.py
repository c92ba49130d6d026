"""``kvdrift finite-state``: the paper's exact finite-state check."""

from __future__ import annotations

import typer

from kvdrift.cli.common import console, say, strict_json, user_errors


@user_errors
def finite_state(
    systems: int = typer.Option(24, help="Number of random binary systems (c = 1..systems)."),
    replicates: int = typer.Option(512, help="Replicates per estimator and system."),
    horizon: int = typer.Option(3, help="Horizon H (generated positions)."),
    seed: int = typer.Option(0, help="Seed for the systems and both estimators."),
    figure: str = typer.Option("finite-state.png", help="Where to write the PNG figure (a file "
                               "name; its folder is made if missing)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Reproduce the paper's finite-state check: naive rollouts vs SWRB against exact risk."""
    from kvdrift import limits
    from kvdrift.run.outdir import check_file_path

    limits.seed(seed, "--seed", limits.MAX_FINITE_SEED)
    limits.finite_study(systems, replicates, horizon, seed)  # before numpy and torch load
    figure = check_file_path(figure, "--figure")  # before anything runs or is written
    from kvdrift.finite.check import run_finite_study
    from kvdrift.report.figures import plot_finite_study
    from kvdrift.report.terminal import finite_state_tables, print_whole

    if as_json:
        result = run_finite_study(systems, replicates, horizon, seed)
    else:
        with console.status("") as status:
            def progress(c: int) -> None:
                status.update(f"system {c}/{systems}")

            result = run_finite_study(systems, replicates, horizon, seed, progress=progress)
    path = plot_finite_study(result, figure)
    if as_json:
        print(strict_json(result.to_json() | {"figure": str(path)}))
        return
    table, summary, notes = finite_state_tables(result)
    print_whole(console, table)
    print_whole(console, summary)
    for line in notes:
        say(line)
    say(f"figure: {path}")
