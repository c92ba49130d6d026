"""Document sources: the built-in RULER-style generator, JSONL files, Hugging Face datasets
(and :mod:`kvdrift.data.sources`, the typed sources a study config is parsed into)."""

from kvdrift.data.document import Document, DocumentError
from kvdrift.data.loaders import load_hf_dataset, load_jsonl, write_jsonl
from kvdrift.data.ruler import (
    MIN_TARGET_TOKENS,
    RULER_FAMILIES,
    TASK_FAMILIES,
    RulerConfig,
    generate,
    make_document,
)
from kvdrift.data.ruler_tasks import NEEDLE_TYPES
from kvdrift.data.sizing import Fit, fit_to_length, length_band, token_counter
from kvdrift.data.sources import (
    DocumentSource,
    HFSource,
    JsonlSource,
    RulerSource,
    source_from_table,
)

__all__ = [
    "MIN_TARGET_TOKENS",
    "NEEDLE_TYPES",
    "RULER_FAMILIES",
    "TASK_FAMILIES",
    "Document",
    "DocumentError",
    "DocumentSource",
    "Fit",
    "HFSource",
    "JsonlSource",
    "RulerConfig",
    "RulerSource",
    "fit_to_length",
    "generate",
    "length_band",
    "load_hf_dataset",
    "load_jsonl",
    "make_document",
    "source_from_table",
    "token_counter",
    "write_jsonl",
]
