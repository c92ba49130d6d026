"""Running a study: documents from every source, every model, every action, one store."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

from kvdrift import limits
from kvdrift.data.document import WHOLE_PROMPT, Document, documents_sha256
from kvdrift.output import OutputDir
from kvdrift.run.executors import open_executor
from kvdrift.run.lock import StoreLock
from kvdrift.run.memory_store import MemoryStore
from kvdrift.run.outdir import check_output_dir
from kvdrift.run.records import UnitKey
from kvdrift.run.runner import RunConfig
from kvdrift.run.store import DOCUMENTS_HASH, RunStore
from kvdrift.study_config import StudyConfig


def _unique(docs: list[Document]) -> list[Document]:
    seen: dict[str, int] = {}
    for i, d in enumerate(docs):
        if d.id in seen:
            raise ValueError(f"document id {d.id!r} appears in two sources; ids must be unique")
        seen[d.id] = i
    return docs


def protocol_record(config: StudyConfig, fixed: list[Document]) -> dict[str, list[str]]:
    """What ``run.json`` records of the study's protocol: ``{"protocol": [...]}``, the
    protocols its documents use (:attr:`~kvdrift.data.document.Document.protocol`), where any
    asks a question after the compressed context; empty (nothing recorded, so earlier stores
    resume) where every document is compressed whole."""
    found = {d.protocol for d in fixed}
    for src in config.documents:
        if src.needs_tokenizer:
            found.add(src.protocol)
    if found <= {WHOLE_PROMPT}:
        return {}
    return {"protocol": sorted(found)}


def fixed_documents(config: StudyConfig) -> list[Document]:
    """Documents that need no tokenizer (JSONL files, datasets), loaded before any model."""
    docs: list[Document] = []
    for src in config.documents:
        if not src.needs_tokenizer:
            docs += src.documents()
    return docs


def model_documents(config: StudyConfig, fixed: list[Document], tokenizer) -> list[Document]:
    """All documents for one model: generated ones are sized with its tokenizer."""
    docs = list(fixed)
    for src in config.documents:
        if src.needs_tokenizer:
            docs += src.documents(tokenizer)
    if not docs:
        raise ValueError("the study's document sources produced no documents")
    limits.documents(docs, "the study's document sources")
    return _unique(docs)


def _prepared(config: StudyConfig, run: RunConfig, fixed: list[Document], in_process: bool,
              allow_download: bool, load: Callable[[], object] | None,
              given: object | None = None):
    """A model's driver side and documents, checked against its context window and layers
    (``given``: the model, where it is in memory already)."""
    if config.engine == "llama.cpp":
        return _prepared_llama(config, run, fixed)
    from kvdrift.lm.factory import (
        LMPairSource,
        check_actions_fit,
        check_fits,
        check_generators_fit,
        check_questions_fit,
        driver_side,
    )
    from kvdrift.lm.generators.tokenizers import check_one_tokenizer

    presses = config.presses.only(run.actions)  # the press objects this study runs
    source = LMPairSource(run.model, config.device, config.dtype, config.chat_template,
                          allow_download, presses, eager=frozenset(run.extra.get("eager", ())),
                          generators=config.generators or None)
    specs = [a for a in run.actions if a not in config.generators]  # spec strings, presses
    # Q's tokenizer and layers against P's, before any weights load (P's too, where named)
    check_generators_fit(specs, given if given is not None else run.model, allow_download,
                         config.device, config.dtype)
    side = driver_side(source, in_process, load)
    for name, q in config.generators.items():  # models handed over as Q: P's tokenizer
        check_one_tokenizer(side.tokenizer, q.tokenizer, name)
    docs = model_documents(config, fixed, side.tokenizer)
    prompts = check_fits(docs, run.horizon, side, config.chat_template)
    check_questions_fit(docs, specs, presses)  # before the press's own rules
    check_actions_fit(specs, side, presses, run.horizon, prompts, run.estimator)
    limits.batch_memory(min(run.batch or run.replicates, run.replicates),
                        len(side.tokenizer), run.model)  # a batch holds <= K rows
    return side, docs


def _prepared_llama(config: StudyConfig, run: RunConfig, fixed: list[Document]):
    """The llama.cpp engine's driver side and documents: actions, GGUF files and prompts
    checked before llama.cpp loads a model (:mod:`kvdrift.llamacpp`)."""
    from kvdrift.llamacpp.binding import llama
    from kvdrift.llamacpp.factory import LlamaCppFactory, check_llama_study, gguf_tokenizer
    from kvdrift.lm.factory import DriverSide, check_fits

    info = check_llama_study(run.actions, run.model, run.horizon)
    llama()  # one line, before any work, where llama-cpp-python is missing
    tokenizer = gguf_tokenizer(run.model)
    rows = min(run.batch or run.replicates, run.replicates)
    build = functools.partial(LlamaCppFactory, run.model, tokenizer, run.horizon, rows,
                              config.chat_template)
    checker = build()  # what this build and this model offer, before anything is written
    try:
        checker.check_actions(run.actions)
    finally:
        checker.close()
    side = DriverSide(run.model, tokenizer, build, info.context_length, info.layers)
    docs = model_documents(config, fixed, tokenizer)
    check_fits(docs, run.horizon, side, config.chat_template)
    return side, docs


def _say_eager(config: StudyConfig, notice: Callable[[str], None] | None) -> None:
    """Say, in one line, which press's prefill runs with eager attention (the command line's
    ``notice``; else on stderr, as a notebook shows it)."""
    line = config.eager_note()
    if line is None:
        return
    if notice is not None:
        notice(line)
    else:
        import sys

        print(f"note: {line}", file=sys.stderr)


def run_study(
    config: StudyConfig,
    out: str | Path | OutputDir,
    load: Callable[[str], object] | None = None,
    on_unit: Callable[[UnitKey, bool], None] | None = None,
    on_model: Callable[[str, int], None] | None = None,
    on_workers: Callable[[int], None] | None = None,
    recompute: bool = False,
    allow_download: bool = False,
    notice: Callable[[str], None] | None = None,
    fixed: list[Document] | None = None,
    models: Mapping[str, object] | None = None,
) -> RunStore:
    """Run every unit of the study into ``out`` (resumable) with its executor; returns the store.

    ``load(model_name)`` returns a :class:`~kvdrift.lm.loading.model.LoadedModel` for the local
    executor (default: load it with the study's device and dtype; the Ray executor loads
    models in its workers and only the tokenizer and config here); ``models`` are models
    already loaded, by the name the study gives them (never looked up; they run in this
    process); ``on_model(name, units)``,
    ``on_unit(key, skipped)`` and ``on_workers(live_workers)`` report progress, ``notice``
    hears which damaged units are recomputed; ``fixed`` are the study's
    :func:`fixed_documents` when the caller has read them already. ``out`` is checked first
    (:func:`~kvdrift.run.outdir.check_output_dir`: not the root, not empty, not another
    program's folder, no link inside, not inside another kvdrift folder unless ``out`` is a
    folder the caller holds, a frontier's stage), and every model's documents are checked
    before the store is created (a refused study writes nothing). The store's lock is held
    while it is written (one writer per store); ``recompute`` recomputes units stored under other
    settings instead of refusing them; ``allow_download`` lets a hub id missing from the local
    cache download.
    """
    from kvdrift.lm.actions.spec import describe_actions
    from kvdrift.lm.loading.pretrained import check_model_name
    from kvdrift.user_presses import refuse_missing_presses

    models = dict(models or {})
    if isinstance(out, OutputDir):  # a frontier's stage: held by the frontier, inside it
        check_output_dir(out.path, nested=True)
        folder = out
    else:  # nothing is written outside it, nor into another folder
        folder = OutputDir(check_output_dir(out))
    folder.marker = "run"
    StoreLock(folder).refuse_if_busy()  # at once, not after the model loaded
    refuse_missing_presses(folder.path, config.run.actions, config.presses)
    if config.presses.only(config.run.actions) and config.executor.kind != "local":
        raise ValueError(f"press objects of your own run in this process; use the local "
                         f"executor for them, not {config.executor.kind!r}")
    if (models or config.generators) and config.executor.kind != "local":
        raise ValueError(f"models given in memory run in this process; use the local executor, "
                         f"not {config.executor.kind!r}")
    if config.engine == "llama.cpp" and (models or config.executor.kind != "local"):
        raise ValueError("the llama.cpp engine runs GGUF files in this process: give model "
                         "names or .gguf paths, with the local executor")
    for name in config.models:  # no network, no model code, no download without a network
        if name not in models and config.engine == "transformers":
            check_model_name(name, allow_download)
    fixed = fixed_documents(config) if fixed is None else fixed
    if not fixed and not any(s.needs_tokenizer for s in config.documents):
        raise ValueError("the study's document sources produced no documents")
    fixed_sha256 = documents_sha256(fixed)  # what the store compares on resume
    runs = [config.for_model(name) for name in config.models]  # each model's run settings
    _say_eager(config, notice)
    recorded = config.as_dict() | {DOCUMENTS_HASH: fixed_sha256} | protocol_record(config, fixed)
    settings = config.executor.for_device(config.device)
    with open_executor(settings, on_workers=on_workers) as executor:

        def prepared(run: RunConfig, in_process: bool):
            if run.model in models:
                return _prepared(config, run, fixed, True, allow_download,
                                 functools.partial(models.get, run.model), models[run.model])
            return _prepared(config, run, fixed, in_process, allow_download,
                             functools.partial(load, run.model) if load else None)

        # Validate, then write: every model's documents are checked (the first model as it
        # will run, the others from their tokenizer and config alone) before the store
        # exists, so a refused study leaves the output directory as it found it.
        first = prepared(runs[0], executor.in_process)
        for run in runs[1:]:
            prepared(run, in_process=False)
        lock = StoreLock(folder).acquire()
        try:
            presses = config.presses.identities(config.run.actions)
            if config.engine == "llama.cpp":
                from kvdrift.llamacpp.cache_types import describe_llama_actions

                described = describe_llama_actions(config.run.actions)
            else:
                described = describe_actions([a for a in config.run.actions
                                              if a not in presses])
            described |= {a: {"press": identity} for a, identity in presses.items()}
            store = RunStore.open(folder, recorded, recompute=recompute, notice=notice,
                                  presses=described)
            for i, run in enumerate(runs):
                side, docs = first if i == 0 else prepared(run, executor.in_process)
                first = None  # the first model is not held while the next one loads
                if on_model:
                    on_model(run.model, len(docs) * len(run.actions))
                executor.run(run, docs, side.build, store, on_unit=on_unit)
        finally:
            lock.release()
    return store


def run_in_memory(
    config: StudyConfig,
    models: Mapping[str, object],
    on_unit: Callable[[UnitKey, bool], None] | None = None,
) -> MemoryStore:
    """Run every unit of the study on models already loaded (``models``, by the name the study
    gives them) into a :class:`~kvdrift.run.memory_store.MemoryStore`: nothing is written.
    The same checks as :func:`run_study`, in this process."""
    from kvdrift.run.runner import run_units

    missing = [name for name in config.models if name not in models]
    if missing:
        raise ValueError(f"model {missing[0]!r} is not loaded; give every model of the study")
    fixed = fixed_documents(config)
    if not fixed and not any(s.needs_tokenizer for s in config.documents):
        raise ValueError("the study's document sources produced no documents")
    store = MemoryStore()
    _say_eager(config, None)
    for name in config.models:
        run = config.for_model(name)
        side, docs = _prepared(config, run, fixed, True, False,
                               functools.partial(models.get, name), models[name])
        run_units(run, docs, side.build(), store, on_unit=on_unit)
    return store
