"""Running a study: documents from every source, every model, every action, one store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvdrift.data import generate, load_hf_dataset, load_jsonl, token_counter
from kvdrift.data.document import Document
from kvdrift.run.records import UnitKey
from kvdrift.run.runner import run_units
from kvdrift.run.store import RunStore
from kvdrift.study_config import StudyConfig, ruler_config


def _unique(docs: list[Document]) -> list[Document]:
    seen: dict[str, int] = {}
    for i, d in enumerate(docs):
        if d.id in seen:
            raise ValueError(f"document id {d.id!r} appears in two sources; ids must be unique")
        seen[d.id] = i
    return docs


def fixed_documents(config: StudyConfig) -> list[Document]:
    """Documents that need no tokenizer (JSONL files, datasets), loaded before any model."""
    docs: list[Document] = []
    for src in config.documents:
        if src["source"] == "jsonl":
            docs += load_jsonl(src["path"])
        elif src["source"] == "hf":
            options = {k: v for k, v in src.items() if k not in ("source", "name", "split",
                                                                  "prompt_field")}
            docs += load_hf_dataset(src["name"], src["split"], src["prompt_field"], **options)
    return docs


def model_documents(config: StudyConfig, fixed: list[Document], tokenizer) -> list[Document]:
    """All documents for one model: generated ones are sized with its tokenizer."""
    docs = list(fixed)
    for src in config.documents:
        if src["source"] == "ruler":
            docs += generate(ruler_config(src), token_counter(tokenizer))
    if not docs:
        raise ValueError("the study's document sources produced no documents")
    return _unique(docs)


def run_study(
    config: StudyConfig,
    out: str | Path,
    load: Callable[[str], object] | None = None,
    on_unit: Callable[[UnitKey, bool], None] | None = None,
    on_model: Callable[[str, int], None] | None = None,
) -> RunStore:
    """Run every unit of the study into ``out`` (resumable); returns the store.

    ``load(model_name)`` returns a :class:`~kvdrift.lm.model.LoadedModel` (default: load it
    with the study's device and dtype); ``on_model(name, units)`` and
    ``on_unit(key, skipped)`` report progress.
    """
    from kvdrift.lm.factory import LMPairFactory
    from kvdrift.lm.model import load_model

    fixed = fixed_documents(config)
    if not fixed and not any(s["source"] == "ruler" for s in config.documents):
        raise ValueError("the study's document sources produced no documents")
    store = RunStore.open(out, config.as_dict())
    for name in config.models:
        loaded = load(name) if load else load_model(name, config.device, config.dtype)
        docs = model_documents(config, fixed, loaded.tokenizer)
        total = len(docs) * len(config.run.actions)
        if on_model:
            on_model(name, total)
        factory = LMPairFactory(loaded, config.chat_template)
        factory.check_fits(docs, config.run.horizon)
        run_units(config.for_model(name), docs, factory, store, on_unit=on_unit)
    return store
