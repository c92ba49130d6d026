"""The ``kvdrift`` command line: finite-state check, runs, studies and reports."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# OpenMP threads that busy-wait between the many small matmuls of decoding stall each other
# on small CPU machines; passive waiting is several times faster there and free on GPUs.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kvdrift.run import UnitFailed  # noqa: E402

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Measure how KV-cache eviction changes what a language model generates.")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def root() -> None:
    """Measure how KV-cache eviction changes what a language model generates."""


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a user's mistake (ValueError, missing file) or a unit whose workers kept dying
    into one clear line and exit code 2.

    Set ``KVDRIFT_DEBUG=1`` to see the traceback instead.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, FileNotFoundError, KeyError, UnitFailed) as exc:
            if os.environ.get("KVDRIFT_DEBUG"):
                raise
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
            raise typer.Exit(2) from None

    return wrapper


def _strict_json(obj: Any) -> str:
    """JSON that strict parsers accept: NaN and infinities (undefined quantities) become null."""
    from kvdrift.report.numbers import to_json_safe

    return json.dumps(to_json_safe(obj), indent=2, allow_nan=False)


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
        print(_strict_json(result.to_json() | {"figure": str(path)}))
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


DEFAULT_DOCS = dict(families=("niah_single", "vt", "cwe"), target_lengths=(512,),
                    documents_per_stratum=2, seed=0)


def _progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                    transient=False)


def _workers_label(n: int) -> str:
    return f"{n} worker{'' if n == 1 else 's'} · "


def _interrupted(store_dir: Path) -> typer.Exit:
    err_console.print(f"[yellow]interrupted:[/] finished units are saved in {store_dir}; "
                      "run the same command again to resume.")
    return typer.Exit(130)


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _run_table(summaries) -> Table:
    table = Table(title="Per action (documents weighted equally within strata, strata equally)")
    for col in ("model", "action", "docs", "P(tau<=H)", "entry time", "R", "O_H", "E_H", "Pi_H",
                "C_H", "F"):
        table.add_column(col, justify="right")
    for s in summaries:
        table.add_row(s.model, s.action, str(s.documents), f"{100 * s.p_diverge:.1f}%",
                      f"{s.mean_entry_time:.1f}", f"{100 * s.R:.2f}%", f"{100 * s.O:.2f}%",
                      f"{100 * s.E:.2f}%", f"{100 * s.Pi:.2f}%", f"{100 * s.C:.1f}%",
                      f"{100 * s.F:.2f}%")
    return table


@app.command("run")
@user_errors
def run(
    model: str = typer.Option("smollm2", help="'smollm2' (embedded) or a Hugging Face id/path."),
    actions: str = typer.Option("snapkv-half,recent-half",
                                help="Comma list of actions, e.g. snapkv-half,knorm:ratio=0.5."),
    docs: Path | None = typer.Option(None, help="JSONL file of {id, prompt, stratum?} objects "
                                     "(default: six generated 512-token RULER-style tasks)."),
    replicates: int = typer.Option(8, help="Replicates K per document and action."),
    horizon: int = typer.Option(32, help="Generated positions H."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
    estimator: str = typer.Option("rollout", help="rollout (complete coupled rollouts) or swrb."),
    depths: str = typer.Option("", help="Observation depths L for window bounds, e.g. 4,8."),
    seed: int = typer.Option(0, help="Seed of the run (each document derives its own)."),
    batch: int = typer.Option(0, help="Most replicates per forward batch (0 = all); lower it "
                              "when long prompts do not fit in memory."),
    out: Path = typer.Option(Path("runs/run"), help="Output directory (resumable)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    chat_template: bool = typer.Option(True, help="Wrap prompts in the model's chat template."),
    executor: str | None = typer.Option(None, help="local (default: this process) or ray."),
    ray_address: str | None = typer.Option(None, help="Join this Ray cluster ('auto' or "
                                           "HOST:PORT; implies --executor ray)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Measure the given actions on one model over a set of documents."""
    from kvdrift.analysis.summary import summarize
    from kvdrift.data import RulerConfig, generate, load_jsonl, token_counter
    from kvdrift.lm.actions import parse_action
    from kvdrift.lm.factory import LMPairSource, driver_side
    from kvdrift.lm.model import resolve_device, resolve_dtype
    from kvdrift.run.executors import ExecutorConfig, open_executor
    from kvdrift.run.runner import RunConfig
    from kvdrift.run.store import RunStore

    action_list = _split(actions)
    for a in action_list:
        parse_action(a)
    settings = ExecutorConfig().overridden(executor, ray_address).for_device(device)
    if settings.kind == "local":  # Ray workers check the device where the model goes
        resolve_device(device)
    resolve_dtype(dtype)
    depth_list = tuple(int(d) for d in _split(depths))
    documents = load_jsonl(docs) if docs is not None else None
    config = RunConfig(model=model, actions=action_list, replicates=replicates, horizon=horizon,
                       temperature=temperature, estimator=estimator, depths=depth_list, seed=seed,
                       batch=batch,
                       extra={"docs": str(docs) if docs else "builtin", "device": device,
                              "dtype": dtype, "chat_template": chat_template})
    store = RunStore.open(out, config.as_dict())
    workers = {"label": ""}  # "N workers · " while an executor has workers
    try:
        with open_executor(settings, on_workers=lambda n: workers.update(
                label=_workers_label(n))) as pool:
            with console.status(f"loading {model}"):
                source = LMPairSource(model, device, dtype, chat_template)
                tokenizer, build = driver_side(source, pool.in_process)
            if documents is None:
                documents = generate(RulerConfig(**DEFAULT_DOCS), token_counter(tokenizer))
            with _progress() as progress:
                task = progress.add_task("units", total=len(documents) * len(action_list))

                def on_unit(key, skipped):
                    progress.update(task, advance=1, description=f"{workers['label']}"
                                    f"{key.doc_id[:24]} · {key.action}")

                pool.run(config, documents, build, store, on_unit=on_unit)
    except KeyboardInterrupt:
        raise _interrupted(out) from None
    summaries = summarize(store.read("steps").to_pandas(), store.read("replicates").to_pandas())
    if as_json:
        print(_strict_json([s.as_dict() for s in summaries]))
        return
    console.print(_run_table(summaries))
    console.print(f"records: {out}/steps, {out}/replicates (Parquet)")


def _write_report(
    store_dir: Path, out: Path | None, bootstrap: int | None = None, alpha: float | None = None
):
    """Analyse a store with its saved analysis options (``bootstrap``/``alpha`` override)."""
    from kvdrift.analysis.study import AnalysisOptions, analyze
    from kvdrift.report import write_report
    from kvdrift.run.store import RunStore

    store = RunStore(store_dir)
    meta = store.metadata
    saved = dict(meta["config"].get("analysis", {}))  # a plain run saves none: defaults
    saved["endpoints"] = tuple(saved.get("endpoints", ()))
    overrides = {k: v for k, v in (("bootstrap", bootstrap), ("alpha", alpha)) if v is not None}
    options = AnalysisOptions(**(saved | overrides))
    with console.status("analysing (bootstrap over documents)"):
        analysis = analyze(store.read("steps").to_pandas(), store.read("replicates").to_pandas(),
                           options, meta={"config": meta["config"], "versions": meta["versions"],
                                          "temperature": meta["config"].get("temperature")})
    with console.status("writing the report"):
        path = write_report(analysis, out or store_dir / "report")
    return analysis, path


@app.command("report")
@user_errors
def report(
    directory: Path = typer.Argument(..., help="A run or study directory."),
    out: Path | None = typer.Option(None, help="Report directory (default: DIR/report)."),
    bootstrap: int | None = typer.Option(None, help="Bootstrap draws (default: the study's)."),
    alpha: float | None = typer.Option(None, help="Interval level alpha (default: the study's)."),
    as_json: bool = typer.Option(False, "--json", help="Also print every number as JSON."),
) -> None:
    """Analyse a run or study directory and write an HTML report with figures."""
    from kvdrift.report import summary_table

    analysis, path = _write_report(directory, out, bootstrap, alpha)
    if as_json:
        print((path.parent / "analysis.json").read_text())
        return
    console.print(summary_table(analysis))
    console.print(f"report: {path}")


@app.command("study")
@user_errors
def study(
    config_path: Path = typer.Argument(..., metavar="CONFIG.toml", help="Study configuration."),
    out: Path | None = typer.Option(None, help="Study directory (default: runs/<name>)."),
    report_after: bool = typer.Option(True, "--report/--no-report",
                                      help="Write the report when the runs finish."),
    executor: str | None = typer.Option(None, help="local or ray (default: the config's "
                                        "[study] executor, else local)."),
    ray_address: str | None = typer.Option(None, help="Join this Ray cluster ('auto' or "
                                           "HOST:PORT; implies --executor ray)."),
) -> None:
    """Run a study from a TOML configuration (resumable), then write its report."""
    from dataclasses import replace

    from kvdrift.report import summary_table
    from kvdrift.study import run_study
    from kvdrift.study_config import load_study

    config = load_study(config_path)
    config = replace(config, executor=config.executor.overridden(executor, ray_address))
    out = out or Path("runs") / config.name
    try:
        with _progress() as progress:
            task = progress.add_task("units", total=None)
            shown = {"workers": "", "unit": ""}  # workers: "N workers · " on the Ray executor

            def show():
                progress.update(task, description=shown["workers"] + shown["unit"])

            def on_model(name, units):
                shown["unit"] = name
                progress.reset(task, total=units, description=shown["workers"] + name)

            def on_unit(key, skipped):
                shown["unit"] = f"{key.model} · {key.doc_id[:24]} · {key.action}"
                progress.update(task, advance=1)
                show()

            def on_workers(n):
                shown["workers"] = _workers_label(n)
                show()

            def load(name):
                from kvdrift.lm.model import load_model

                progress.update(task, description=f"loading {name}")
                return load_model(name, config.device, config.dtype)

            run_study(config, out, load=load, on_unit=on_unit, on_model=on_model,
                      on_workers=on_workers)
    except KeyboardInterrupt:
        raise _interrupted(out) from None
    if not report_after:
        console.print(f"records: {out}")
        return
    analysis, path = _write_report(out, None)
    console.print(summary_table(analysis))
    console.print(f"report: {path}")


def main() -> None:
    """Console entry point."""
    app(prog_name="kvdrift")


if __name__ == "__main__":
    sys.exit(main())
