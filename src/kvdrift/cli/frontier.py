"""``kvdrift frontier``: per method family, the least KV cache certified to keep a measure
within a tolerance; a resumable search of study stages, then its report."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from kvdrift import checks, limits
from kvdrift.cli.common import console, say, strict_json, user_errors
from kvdrift.cli.runs import DOWNLOAD_HELP, RAY_ADDRESS_HELP, RECOMPUTE_HELP, run_with_progress

#: How many documents the default sources generate (``study_config.DEFAULT_DOCUMENTS``: three
#: task families, one length, two each; not imported here, its module loads the executors).
DEFAULT_DOCUMENT_COUNT = 6


@user_errors
def frontier(
    families: str = typer.Option("snapkv,recent,kivi",
                                 help="Comma list of method families whose budget the search "
                                 "varies: eviction presses (snapkv, recent, pyramidkv, "
                                 "adakv-snapkv, ...), kivi, gguf, chains (snapkv+kivi:bits=4), "
                                 "weights (P's weights as llama.cpp's weight types: Q's "
                                 "weights are then the memory), "
                                 "or a decoding-time press over its target "
                                 "(decoding-knorm, decoding-snapkv:interval=64,window_size=4, "
                                 "cam-knorm:interval=64,merge=8)."),
    measure: str = typer.Option("R_tv <= 0.1", help="The measure and its tolerance: "
                                "'R_tv <= x', 'R <= x', 'F <= x', 'kl <= x', "
                                "'acceptance >= x' or 'task >= x'."),
    alpha: float = typer.Option(0.05, help="1 - confidence, held over the whole search."),
    cap: float | None = typer.Option(None, help="A stated bound on an unbounded measure's "
                                     "per-replicate values (kl): the certificate assumes it, "
                                     "and a value above it stops the search. Without it, kl "
                                     "gets estimates only, never 'certified'."),
    max_replicates: int = typer.Option(limits.DEFAULT_SEARCH_REPLICATES,
                                       help="Most replicates per document at "
                                       "one budget; a budget still undecided then ends its "
                                       "family's sequence. A cap too small to certify anything "
                                       "is refused before any model loads."),
    model: str = typer.Option("smollm2", help="'smollm2' (embedded) or a Hugging Face id/path."),
    docs: Path | None = typer.Option(None, help="JSONL file of {id, prompt, stratum?, answer?} "
                                     "(default: six generated 512-token RULER-style tasks)."),
    replicates: int = typer.Option(8, help="Most replicates per document in each look (the "
                                   "bounds are checked after every one; a look runs fewer "
                                   "where the values say the decision is due sooner)."),
    horizon: int = typer.Option(32, help="Generated positions H."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
    seed: int = typer.Option(0, help="Seed of the search (each look's seed is a hash of it and "
                             "the look: another seed shares no random stream)."),
    batch: int = typer.Option(0, help="Most replicates per forward batch (0 = all)."),
    out: str = typer.Option("runs/frontier", help="Output directory (resumable): new, empty, or "
                            "a kvdrift frontier to resume; not inside a run's directory."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    chat_template: bool = typer.Option(True, help="Wrap prompts in the model's chat template."),
    executor: str | None = typer.Option(None, help="local (default: this process) or ray."),
    ray_address: str | None = typer.Option(None, help=RAY_ADDRESS_HELP),
    presses: Path | None = typer.Option(None, metavar="FILE", help="A Python file defining "
                                        "FAMILIES, a dict from family name to a function of "
                                        "the ratio kept returning a kvpress press; its names "
                                        "can then be given in --families (resuming needs the "
                                        "file again)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    recompute: bool = typer.Option(False, "--recompute", help=RECOMPUTE_HELP),
    allow_download: bool = typer.Option(False, "--allow-download", help=DOWNLOAD_HELP),
    engine: str = typer.Option("transformers", help="transformers, or llama.cpp: walk "
                               "llama.cpp's cache types (gguf) or its weight quants "
                               "(gguf-weights) inside llama.cpp (docs/llama-cpp.md)."),
) -> None:
    """Find, per family, the least KV cache certified within the tolerance at the stated
    confidence; write the frontier's report."""
    from kvdrift.frontier_search.families import (
        check_engine_families,
        check_family_names,
        family_budgets,
        split_families,
    )
    from kvdrift.lm.loading.pretrained import check_model_name
    from kvdrift.run.outdir import check_frontier_dir
    from kvdrift.study_config import ENGINES

    # What needs neither torch nor kvpress is checked before they are imported (seconds).
    out = check_frontier_dir(out)
    limits.search_replicates(replicates, max_replicates, ("--replicates", "--max-replicates"))
    limits.seed(seed, "--seed", limits.MAX_SEED - limits.MAX_SEARCH_REPLICATES)  # + look - 1
    names = check_family_names(split_families(families))
    checks.choice(engine, "--engine", ENGINES)
    check_engine_families(names, engine)
    if presses is None:  # names a presses file defines are known only once it is loaded
        for name in names:  # their press names, from a static table (no kvpress)
            _builtin_family(name)
    from kvdrift.frontier_search.search import SearchSettings

    settings = SearchSettings(alpha=alpha, replicates=replicates,
                              max_replicates=max_replicates)
    documents = check_certifiable(measure, cap, docs, settings, len(names))
    if engine == "transformers":
        check_model_name(model, allow_download)  # a local model: its config.json, as JSON
    from kvdrift.user_presses import load_presses_file

    user = load_presses_file(presses) if presses is not None else None
    if docs is not None and engine == "transformers":  # before any folder or model
        from kvdrift import preflight
        from kvdrift.data.sources import JsonlSource

        sources = (JsonlSource(str(docs)),)
        preflight.check_questions(names, sources, preflight.check_documents(sources), {},
                                  defined=user.families if user else (), what="family")
    for name in names if user is not None else ():
        if name not in user.families:
            family_budgets(name)
    from kvdrift.frontier_search.study import FrontierConfig, run_frontier
    from kvdrift.output import OutputDir
    from kvdrift.report.frontier import frontier_examples, frontier_table, write_frontier_report
    from kvdrift.report.terminal import print_whole
    from kvdrift.study_config import single_model_study

    study = single_model_study(model, ("full",), docs, replicates=replicates, horizon=horizon,
                               temperature=temperature, estimator="rollout", depths=(),
                               seed=seed, batch=batch, device=device, dtype=dtype,
                               chat_template=chat_template, name="frontier", presses=user,
                               engine=engine)
    study = replace(study, executor=study.executor.overridden(executor, ray_address))
    config = FrontierConfig.parse(study, names, measure, settings, cap)
    cache: dict[str, object] = {}

    def run_stage(stage, where: OutputDir) -> None:
        run_with_progress(stage, where, recompute, allow_download, models=cache)

    folder = OutputDir(out, marker="frontier")  # held for the whole command
    result = run_frontier(config, folder, run_stage, documents)
    html = write_frontier_report(result, folder.subdir("report", marker="report"),
                                 examples=frontier_examples(result, folder.subdir("stages")))
    if as_json:
        print(strict_json(result.to_json()))
        return
    print_whole(console, frontier_table(result))
    say(f"report: {html}")


def _builtin_family(name: str) -> None:
    """Refuse a family kvdrift does not name (no kvpress imported); a bare name may be a
    family of the user's own whose presses file was not given."""
    from kvdrift.frontier_search.families import family_budgets

    try:
        family_budgets(name)
    except ValueError as exc:
        if ":" in name or "+" in name:
            raise
        raise ValueError(f"{exc}; a family of your own needs its presses file again "
                         f"(--presses FILE, with FAMILIES)") from None


def check_certifiable(measure: str, cap: float | None, docs: Path | None, settings,
                      families: int) -> int | None:
    """The measure parses, and the settings can certify something at all (pure arithmetic,
    before any model loads): the documents are ``--docs``'s records (nonblank lines, at most
    the documents it holds; for a measure read from task scores, only those with an answer)
    or the six generated ones); returns that count (None when the loader is left to name a
    problem with ``--docs``)."""
    from kvdrift.frontier_search.feasibility import check_feasible, gives_values
    from kvdrift.frontier_search.measure import parse_measure

    parsed = parse_measure(measure, cap)
    count = DEFAULT_DOCUMENT_COUNT
    if docs is not None:
        from kvdrift.output import open_regular

        try:  # a regular file only, opened once (never a pipe that could block)
            with open_regular(docs, "--docs") as f:
                lines = [line for line in f if line.strip()]
            count = sum(gives_values(json.loads(line), parsed) for line in lines)
        except (OSError, ValueError, AttributeError, RecursionError):
            return None  # the document loader names the problem
    if count:
        check_feasible(parsed, count, settings.alpha, families, settings.max_replicates,
                       settings.bet)
    return count
