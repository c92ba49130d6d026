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
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from kvdrift.run import UnitFailed  # noqa: E402

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Measure how KV-cache eviction changes what a language model generates.")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def root() -> None:
    """Measure how KV-cache eviction changes what a language model generates."""


def _os_error_line(exc: OSError) -> str:
    """One line for a file-system error (read-only or full disk, no permission, ...)."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    reason = exc.strerror or str(exc) or type(exc).__name__
    code = f" (errno {exc.errno})" if exc.errno else ""
    return f"{where}: {reason}{code}" if where else f"{reason}{code}"


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a user's mistake (ValueError, missing file), a file-system error (read-only or
    full disk) or a unit whose workers kept dying into one clear line and exit code 2.

    The message is printed literally (user text such as ``[study]`` or a document id is never
    read as console markup). Set ``KVDRIFT_DEBUG=1`` to see the traceback instead.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, OSError, KeyError, UnitFailed) as exc:
            if os.environ.get("KVDRIFT_DEBUG"):
                raise
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
                message = _os_error_line(exc)
            err_console.print(f"[bold red]error:[/] {escape(str(message))}", highlight=False,
                              markup=True, soft_wrap=True)
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
    from kvdrift.finite.check import PAPER, run_finite_study
    from kvdrift.report.figures import plot_finite_study
    from kvdrift.report.terminal import print_whole

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
                      f"{s.swrb_mean:.4f}", f"{s.swrb_se:.4f}",
                      f"{s.var_ratio:.1f}" if s.informative else "undefined*")
    print_whole(console, table)
    summary = Table(title="Summary beside the paper")
    for col in ("", "kvdrift", "paper"):
        summary.add_column(col, justify="right")
    rows = [("min variance ratio", result.min_var_ratio, "min_var_ratio", "{:.1f}"),
            ("median variance ratio", result.median_var_ratio, "median_var_ratio", "{:.1f}"),
            ("max variance ratio", result.max_var_ratio, "max_var_ratio", "{:.1f}"),
            ("kernel-pair evaluations", result.cost_ratio, "cost_ratio", "x{:.2f}"),
            ("variance-cost advantage", result.advantage, "advantage", "{:.1f}")]
    summary.add_row("informative systems", f"{result.informative} of {len(result.systems)}",
                    "24 of 24")
    for label, ours, key, fmt in rows:
        summary.add_row(label, fmt.format(ours), fmt.format(PAPER[key]))
    print_whole(console, summary)
    for s in result.systems:
        if not s.informative:
            console.print(f"* system {s.system}: variance ratio undefined: "
                          f"{s.var_ratio_undefined}; left out of min / median / max.")
    console.print(f"figure: {escape(str(path))}")


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


def _unit_label(*parts: str) -> str:
    """A progress description naming a unit, printed literally (ids are user text)."""
    return escape(" · ".join(parts))


def _notice(message: str) -> None:
    err_console.print(f"[yellow]note:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _interrupted(store_dir: Path) -> typer.Exit:
    err_console.print(f"[yellow]interrupted:[/] finished units are saved in "
                      f"{escape(str(store_dir))}; run the same command again to resume.")
    return typer.Exit(130)


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@app.command("actions")
def actions_list() -> None:
    """List every action: named ones, kvpress press families, scorers, presses not offered."""
    from kvdrift.lm.actions import actions_help

    print(actions_help())


@app.command("run")
@user_errors
def run(
    model: str = typer.Option("smollm2", help="'smollm2' (embedded) or a Hugging Face id/path."),
    actions: str = typer.Option("snapkv-half,recent-half",
                                help="Comma list of actions, e.g. snapkv-half,knorm:ratio=0.5,"
                                "adakv-snapkv:ratio=0.5; 'help' lists every action."),
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
    recompute: bool = typer.Option(False, "--recompute", help="Recompute finished units "
                                   "stored under other settings instead of refusing them."),
    allow_download: bool = typer.Option(False, "--allow-download", help="Download a hub id "
                                        "that is not in the local Hugging Face cache."),
) -> None:
    """Measure the given actions on one model over a set of documents."""
    from kvdrift.lm.loading import check_model_name

    check_model_name(model, allow_download)  # at once: before torch and kvpress are imported
    from kvdrift.analysis.summary import summarize
    from kvdrift.data import RulerConfig, generate, load_jsonl, token_counter
    from kvdrift.lm.actions import actions_help, parse_action, split_actions
    from kvdrift.lm.factory import LMPairSource, check_fits, driver_side
    from kvdrift.lm.model import resolve_device, resolve_dtype
    from kvdrift.report.terminal import print_whole, run_table
    from kvdrift.run.executors import ExecutorConfig, open_executor
    from kvdrift.run.lock import StoreLock
    from kvdrift.run.runner import RunConfig
    from kvdrift.run.store import RunStore

    if actions.strip() == "help":
        print(actions_help())
        return
    action_list = split_actions(actions)
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
    workers = {"label": ""}  # "N workers · " while an executor has workers
    try:
        with open_executor(settings, on_workers=lambda n: workers.update(
                label=_workers_label(n))) as pool:
            with console.status(f"loading {escape(model)}"):
                source = LMPairSource(model, device, dtype, chat_template, allow_download)
                side = driver_side(source, pool.in_process)
            if documents is None:
                documents = generate(RulerConfig(**DEFAULT_DOCS), token_counter(side.tokenizer))
            check_fits(documents, horizon, side, chat_template)
            # locked and opened after loading: a model typo leaves no store behind
            with StoreLock(out), _progress() as progress:
                store = RunStore.open(out, config.as_dict(), recompute, _notice)
                task = progress.add_task("units", total=len(documents) * len(action_list))

                def on_unit(key, skipped):
                    progress.update(task, advance=1, description=workers["label"]
                                    + _unit_label(key.doc_id[:24], key.action))

                pool.run(config, documents, side.build, store, on_unit=on_unit)
    except KeyboardInterrupt:
        raise _interrupted(out) from None
    summaries = summarize(store.read("steps").to_pandas(), store.read("replicates").to_pandas())
    if as_json:
        print(_strict_json([s.as_dict() for s in summaries]))
        return
    print_whole(console, run_table(summaries, estimator))
    console.print(f"records: {escape(str(out))}/steps, {escape(str(out))}/replicates (Parquet)",
                  highlight=False)


def _write_report(
    store_dir: Path, out: Path | None, bootstrap: int | None = None, alpha: float | None = None
):
    """Analyse a store with its saved analysis options (``bootstrap``/``alpha`` override)."""
    from kvdrift.analysis.directory import analyze_directory
    from kvdrift.report import write_report

    with console.status("analysing (bootstrap over documents)"):
        analysis = analyze_directory(store_dir, bootstrap, alpha)
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
    from kvdrift.report.terminal import print_whole

    analysis, path = _write_report(directory, out, bootstrap, alpha)
    if as_json:
        print((path.parent / "analysis.json").read_text())
        return
    print_whole(console, summary_table(analysis))
    console.print(f"report: {escape(str(path))}", highlight=False)


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
    recompute: bool = typer.Option(False, "--recompute", help="Recompute finished units "
                                   "stored under other settings instead of refusing them."),
    allow_download: bool = typer.Option(False, "--allow-download", help="Download hub ids "
                                        "that are not in the local Hugging Face cache."),
) -> None:
    """Run a study from a TOML configuration (resumable), then write its report."""
    from dataclasses import replace

    from kvdrift.lm.loading import check_model_name
    from kvdrift.report import summary_table
    from kvdrift.report.terminal import print_whole
    from kvdrift.study import run_study
    from kvdrift.study_config import load_study

    config = load_study(config_path)
    config = replace(config, executor=config.executor.overridden(executor, ray_address))
    for name in config.models:
        check_model_name(name, allow_download)
    out = out or Path("runs") / config.name
    try:
        with _progress() as progress:
            task = progress.add_task("units", total=None)
            shown = {"workers": "", "unit": ""}  # workers: "N workers · " on the Ray executor

            def show():
                progress.update(task, description=shown["workers"] + shown["unit"])

            def on_model(name, units):
                shown["unit"] = escape(name)
                progress.reset(task, total=units, description=shown["workers"] + shown["unit"])

            def on_unit(key, skipped):
                shown["unit"] = _unit_label(key.model, key.doc_id[:24], key.action)
                progress.update(task, advance=1)
                show()

            def on_workers(n):
                shown["workers"] = _workers_label(n)
                show()

            def load(name):
                from kvdrift.lm.model import load_model

                progress.update(task, description=f"loading {escape(name)}")
                return load_model(name, config.device, config.dtype,
                                  allow_download=allow_download)

            run_study(config, out, load=load, on_unit=on_unit, on_model=on_model,
                      on_workers=on_workers, recompute=recompute,
                      allow_download=allow_download, notice=_notice)
    except KeyboardInterrupt:
        raise _interrupted(out) from None
    if not report_after:
        console.print(f"records: {out}")
        return
    analysis, path = _write_report(out, None)
    print_whole(console, summary_table(analysis))
    console.print(f"report: {escape(str(path))}", highlight=False)


def _pp(iv) -> str:
    return f"{100 * iv.estimate:+.2f} [{100 * iv.lo:+.2f}, {100 * iv.hi:+.2f}]"


@app.command("predict")
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
    report_path: Path | None = typer.Option(None, "--report", help="Also write the paper's "
                                            "Table 4 as an HTML page here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Predict a full-horizon contrast from short observations, calibrated on development
    documents and checked on evaluation documents."""
    from kvdrift.analysis.directory import predict_directories

    with console.status("reading records") as status:
        result = predict_directories(dev_dir, eval_dir, contrast, window=window, margin=margin,
                                     alpha=alpha, draws=bootstrap, seed=seed, target=target,
                                     on_cell=lambda m, o: status.update(f"{m} · {o}"))
    if report_path is not None:
        from kvdrift.report.paper import write_prediction_report

        write_prediction_report(result, report_path)
    if as_json:
        print(_strict_json(result.to_json()))
        return
    level = 100 * (1 - result.alpha_adjusted)
    what = "rollout TV" if result.target == "tv" else "token mismatch"
    table = Table(title=f"Prediction of R({result.contrast.replace(' - ', ') - R(')}) "
                        f"({what}), "
                        f"percentage points; intervals at {level:.2f}% ({result.cells} cells), "
                        f"margin +-{100 * margin:g} pp")
    for col in ("model", "observation", "dev/eval docs", "selected", "CV MSE (pp^2)",
                "error [interval]", "decision", "MAE", "RMSE"):
        table.add_column(col, justify="right")
    support = Table(title="Uncalibrated supporting contrasts on evaluation documents (pp; "
                          f"pointwise {100 * (1 - result.alpha):g}% intervals)")
    for col in ("model", "observation", "full-horizon gap", "observed gap", "full minus observed"):
        support.add_column(col, justify="right")
    for m in result.models:
        docs = f"{m.development_documents}/{m.evaluation_documents}"
        for o in m.observations:
            table.add_row(m.model, o.label, docs, o.selected,
                          f"{1e4 * o.cv_mse[o.selected]:.2f}", _pp(o.error),
                          o.decision, f"{100 * o.mae:.2f}", f"{100 * o.rmse:.2f}")
            support.add_row(m.model, o.label, *(_pp(iv) for iv in o.supporting.values()))
    console.print(table)
    console.print(support)
    for m in result.models:
        for note in m.notes:
            console.print(f"{m.model}: note: {note}.", highlight=False)


@app.command("plan")
@user_errors
def plan(
    dev_dir: Path = typer.Argument(..., metavar="DEV_DIR", help="Development run or study."),
    target: str = typer.Option(..., help="Quantity or contrast, e.g. 'R(a) - R(b)'."),
    halfwidth: float = typer.Option(..., help="Target interval half-width (0.01 = 1 pp)."),
    alpha: float = typer.Option(0.05, help="Interval level alpha."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Recommend documents per stratum and K for a target half-width, from a development
    run's measured variance and cost, and say whether rollouts or SWRB is cheaper."""
    from kvdrift.analysis.directory import plan_directory

    result = plan_directory(dev_dir, target, halfwidth, alpha)
    if as_json:
        print(_strict_json(result.to_json()))
        return
    table = Table(title=f"Plan for {target}: half-width {halfwidth:g} at "
                        f"{100 * (1 - alpha):g}% (documents weighted equally within strata)")
    for col in ("model", "estimator", "strata", "between var", "within var", "s/doc",
                "s/replicate", "now: docs/stratum, K -> half-width",
                "plan: docs/stratum, K -> half-width", "plan cost"):
        table.add_column(col, justify="right")
    for m in result.models:
        v, now, rec = m.variance, m.current, m.recommended
        table.add_row(m.model, m.estimator, str(v.strata), f"{v.between:.3g}",
                      f"{v.within:.3g}", f"{m.setup_seconds:.1f}",
                      f"{m.replicate_seconds:.1f}",
                      f"{now.documents_per_stratum:g}, {now.replicates} -> "
                      f"{now.halfwidth:.4f}",
                      f"{rec.documents_per_stratum}, {rec.replicates} -> "
                      f"{rec.halfwidth:.4f}",
                      f"{rec.seconds / 3600:.2f} h")
    console.print(table)
    for m in result.models:
        for note in m.notes:
            console.print(f"{m.model}: note: {note}.", highlight=False)
        c = m.comparison
        if c.assumption is None:
            console.print(f"{m.model}: rollouts ({c.reason}).")
            continue
        evals = c.evaluations_per_replicate
        plans = c.plans
        ratio = c.break_even_variance_ratio
        when = ("even with equal variance" if ratio == 1.0 else
                f"only if its within-document variance is {ratio:.2f}x smaller or more"
                if ratio is not None else "at no variance ratio (documents dominate the cost)")
        console.print(
            f"{m.model}: {c.cheaper} is cheaper under equal variance "
            f"(rollout {plans['rollout'].seconds / 3600:.2f} h, "
            f"SWRB {plans['swrb'].seconds / 3600:.2f} h; kernel-pair evaluations per "
            f"replicate {evals['rollout']:.1f} vs {evals['swrb']:.1f}); SWRB wins {when}. "
            f"Assumption: {c.assumption}.", highlight=False)


def main() -> None:
    """Console entry point."""
    app(prog_name="kvdrift")


if __name__ == "__main__":
    sys.exit(main())
