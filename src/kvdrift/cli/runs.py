"""``kvdrift run`` and ``kvdrift study``: one pipeline; ``run`` is a one-model study."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import typer
from rich.markup import escape

from kvdrift.cli.common import (
    console,
    interrupted,
    notice,
    progress_bar,
    say,
    split_list,
    strict_json,
    user_errors,
)
from kvdrift.text import printable

RECOMPUTE_HELP = "Recompute finished units stored under other settings instead of refusing them."
DOWNLOAD_HELP = "Download a hub id that is not in the local Hugging Face cache."
RAY_ADDRESS_HELP = "Join this Ray cluster ('auto' or HOST:PORT; implies --executor ray)."
PRESSES_HELP = ("A Python file defining PRESSES, a dict from action name to a kvpress press "
                "object (your own press included); its names can then be given as actions. "
                "The only way kvdrift runs such a file: resuming needs it again.")
ATTRIBUTION_HELP = ("Record what Q's cache had lost at each divergence: the prompt tokens P "
                    "attended to at tau that Q no longer holds (rollouts; costs one short "
                    "replay per divergent replicate; kvdrift show and the report show them).")


def _workers_label(n: int) -> str:
    return f"{n} worker{'' if n == 1 else 's'} · "


def _unit_label(*parts: str) -> str:
    """A progress description naming a unit, printed literally (ids are user text)."""
    return escape(printable(" · ".join(parts)))


def run_with_progress(config, out: Path, recompute: bool, allow_download: bool,
                      models: dict | None = None) -> None:
    """Run every unit of a study into ``out`` with a progress bar; Ctrl-C keeps finished units.

    ``models`` keeps loaded models by name across calls (the frontier runs several stages)."""
    from kvdrift.study import fixed_documents, run_study

    fixed = fixed_documents(config)  # a bad document file fails before the progress bar
    try:
        with progress_bar() as progress:
            task = progress.add_task("units", total=None)
            shown = {"workers": "", "unit": ""}  # workers: "N workers · " on the Ray executor

            def show():
                progress.update(task, description=shown["workers"] + shown["unit"])

            def on_model(name, units):
                shown["unit"] = escape(printable(name))
                progress.reset(task, total=units, description=shown["workers"] + shown["unit"])

            def on_unit(key, skipped):
                model = (key.model,) if len(config.models) > 1 else ()  # one model: said once
                shown["unit"] = _unit_label(*model, key.doc_id[:24], key.action)
                progress.update(task, advance=1)
                show()

            def on_workers(n):
                shown["workers"] = _workers_label(n)
                show()

            def load(name):
                from kvdrift.lm.generators.build import load_side_model

                if models is not None and name in models:
                    return models[name]
                progress.update(task, description=f"loading {escape(printable(name))}")
                model = load_side_model(name, config.device, config.dtype,
                                        allow_download=allow_download)
                if models is not None:
                    models[name] = model
                return model

            run_study(config, out, load=load, on_unit=on_unit, on_model=on_model,
                      on_workers=on_workers, recompute=recompute,
                      allow_download=allow_download, notice=notice, fixed=fixed)
    except KeyboardInterrupt:
        raise interrupted(out) from None


def _run_name(out: Path) -> str:
    """The study name of ``kvdrift run``: its folder's name where that is a valid study name,
    else "run" (the name is a label only; resuming never compares it)."""
    from kvdrift.study_config import check_study_name

    try:
        return check_study_name(out.resolve().name)
    except ValueError:
        return "run"


def _depths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in split_list(text))
    except ValueError:
        raise ValueError(f"--depths must be a comma list of integers (e.g. 4,8); got {text!r}"
                         ) from None


@user_errors
def run(
    model: str = typer.Option("smollm2", help="'smollm2' (embedded) or a Hugging Face id/path "
                              "(a .gguf file with --engine llama.cpp)."),
    actions: str | None = typer.Option(
        None, help="Comma list of actions, e.g. snapkv-half,knorm:ratio=0.5,"
        "adakv-snapkv:ratio=0.5 (default snapkv-half,recent-half; with --engine llama.cpp: "
        "gguf:k=q8_0,v=q8_0,gguf:k=q4_0,v=q4_0); 'help' lists every action."),
    docs: Path | None = typer.Option(None, help="JSONL file of {id, prompt, stratum?} objects, "
                                     "or {id, context, question(s)} (kvpress's protocol) "
                                     "(default: six generated 512-token RULER-style tasks)."),
    replicates: int = typer.Option(8, help="Replicates K per document and action."),
    horizon: int = typer.Option(32, help="Generated positions H."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
    estimator: str = typer.Option("rollout", help="rollout (complete coupled rollouts) or swrb."),
    depths: str = typer.Option("", help="Observation depths L for window bounds, e.g. 4,8."),
    seed: int = typer.Option(0, help="Seed of the run (each document derives its own)."),
    batch: int = typer.Option(0, help="Most replicates per forward batch (0 = all); lower it "
                              "when long prompts do not fit in memory."),
    out: str = typer.Option("runs/run", help="Output directory (resumable): new, empty, or a "
                            "kvdrift run to resume."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    chat_template: bool = typer.Option(True, help="Wrap prompts in the model's chat template."),
    executor: str | None = typer.Option(None, help="local (default: this process) or ray."),
    ray_address: str | None = typer.Option(None, help=RAY_ADDRESS_HELP),
    attribution: bool = typer.Option(False, "--attribution", help=ATTRIBUTION_HELP),
    presses: Path | None = typer.Option(None, metavar="FILE", help=PRESSES_HELP),
    attention: str = typer.Option("auto", help="Prefill attention of the presses file's "
                                  "presses: auto (eager where a press reads attention "
                                  "weights) or eager (every one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
    recompute: bool = typer.Option(False, "--recompute", help=RECOMPUTE_HELP),
    allow_download: bool = typer.Option(False, "--allow-download", help=DOWNLOAD_HELP),
    engine: str = typer.Option("transformers", help="transformers, or llama.cpp: the actions "
                               "are llama.cpp's cache types, run inside llama.cpp on GGUF "
                               "files (docs/llama-cpp.md)."),
) -> None:
    """Measure the given actions on one model over a set of documents (a one-model study)."""
    from kvdrift import checks
    from kvdrift.study_config import ENGINES

    checks.choice(attention, "--attention", ("auto", "eager"))
    checks.choice(engine, "--engine", ENGINES)
    from kvdrift.lm.loading.pretrained import check_model_name

    if actions is None:
        actions = ("gguf:k=q8_0,v=q8_0,gguf:k=q4_0,v=q4_0" if engine == "llama.cpp"
                   else "snapkv-half,recent-half")
    if actions.strip() == "help":
        from kvdrift.lm.actions.spec import actions_help

        if engine == "llama.cpp":
            from kvdrift.llamacpp.cache_types import rule

            print(f"llama.cpp actions: {rule()}")
        else:
            print(actions_help())
        return
    from kvdrift.run.outdir import check_output_dir

    out = check_output_dir(out)  # at once: reads only, before anything is imported or written
    from kvdrift.run.settings import FLAGS, check_run_numbers

    check_run_numbers(replicates=replicates, horizon=horizon, depths=_depths(depths),
                      batch=batch, temperature=temperature, seed=seed, names=FLAGS)
    if engine == "transformers":
        check_model_name(model, allow_download)  # before torch and kvpress are imported
    from kvdrift.lm.grammar.fields import split_actions
    from kvdrift.user_presses import load_presses_file, refuse_missing_presses

    names = split_actions(actions)
    user = load_presses_file(presses) if presses is not None else None
    refuse_missing_presses(out, names, user)  # a resumed store's presses: the file again
    from kvdrift.preflight import check_resume
    from kvdrift.study_config import single_model_study  # torch, not yet kvpress

    config = single_model_study(
        model, names, docs, replicates=replicates, horizon=horizon,
        temperature=temperature, estimator=estimator, depths=_depths(depths), seed=seed,
        batch=batch, device=device, dtype=dtype, chat_template=chat_template,
        name=_run_name(out), attribution=attribution, presses=user, attention=attention,
        before_torch=functools.partial(check_resume, out), engine=engine)
    config = replace(config, executor=config.executor.overridden(executor, ray_address))
    from kvdrift.directory import StudyDirectory
    from kvdrift.lm.loading.model import resolve_device
    from kvdrift.report.terminal import print_whole, run_rows, run_table

    if config.executor.kind == "local":  # Ray workers check the device where the model goes
        resolve_device(device)
    run_with_progress(config, out, recompute, allow_download)
    directory = StudyDirectory(out)
    analysis = directory.analyze(bootstrap=0)  # point estimates: fast, no intervals
    if as_json:
        print(strict_json(run_rows(analysis)))
        return
    print_whole(console, run_table(analysis))
    if engine == "llama.cpp":  # what llama.cpp users read to choose a quant
        from kvdrift.analysis.kl_statistics import kl_statistics
        from kvdrift.report.terminal import kl_table

        stats = kl_statistics(directory.records().steps)  # rollouts record them; SWRB not
        if stats:
            print_whole(console, kl_table(stats))
    if directory.config.get("protocol"):  # a question asked after the compressed context
        from kvdrift.report.sections.run import protocol_text

        say(f"protocol: {protocol_text(directory.config)}")
    say(f"records: {out}/steps, {out}/replicates (Parquet)")


@user_errors
def study(
    config_path: Path = typer.Argument(..., metavar="CONFIG.toml", help="Study configuration."),
    out: str | None = typer.Option(None, help="Study directory (default: runs/<name>): new, "
                                   "empty, or a kvdrift study to resume."),
    report_after: bool = typer.Option(True, "--report/--no-report",
                                      help="Write the report when the runs finish."),
    executor: str | None = typer.Option(None, help="local or ray (default: the config's "
                                        "[study] executor, else local)."),
    ray_address: str | None = typer.Option(None, help=RAY_ADDRESS_HELP),
    attribution: bool = typer.Option(False, "--attribution", help=ATTRIBUTION_HELP + " The "
                                     "same as [study] attribution = true."),
    presses: Path | None = typer.Option(None, metavar="FILE", help=PRESSES_HELP + " Joins "
                                        "[study] presses = \"FILE\" of the TOML."),
    recompute: bool = typer.Option(False, "--recompute", help=RECOMPUTE_HELP),
    allow_download: bool = typer.Option(False, "--allow-download", help=DOWNLOAD_HELP),
) -> None:
    """Run a study from a TOML configuration (resumable), then write its report."""
    from kvdrift.cli.reports import write_and_summarize
    from kvdrift.lm.loading.pretrained import check_model_name
    from kvdrift.preflight import check_resume
    from kvdrift.run.outdir import check_output_dir
    from kvdrift.study_config import load_study
    from kvdrift.user_presses import load_presses_file

    if out is not None:  # before the file is read (its actions load kvpress)
        out = check_output_dir(out)
    user = load_presses_file(presses) if presses is not None else None

    def resumed(settings: dict) -> None:  # a busy store, or one of other settings: at once
        check_resume(out if out is not None else Path("runs") / settings["name"], settings)

    config = load_study(config_path, {"attribution": True} if attribution else None, user,
                        before_torch=resumed)
    config = replace(config, executor=config.executor.overridden(executor, ray_address))
    if out is None:
        out = check_output_dir(Path("runs") / config.name)
    for name in config.models:  # before any document is read
        check_model_name(name, allow_download)
    run_with_progress(config, out, recompute, allow_download)
    if not report_after:
        say(f"records: {out}")
        return
    write_and_summarize(out, None)

