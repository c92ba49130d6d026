"""Document sources: the built-in RULER-style generator, JSONL files, Hugging Face datasets."""

from kvdrift.data.document import Document
from kvdrift.data.loaders import load_hf_dataset, load_jsonl, write_jsonl
from kvdrift.data.ruler import (
    MIN_TARGET_TOKENS,
    RULER_FAMILIES,
    RulerConfig,
    generate,
    make_document,
)
from kvdrift.data.ruler_tasks import NEEDLE_TYPES
from kvdrift.data.sizing import Fit, fit_to_length, length_band, token_counter

__all__ = [
    "MIN_TARGET_TOKENS",
    "NEEDLE_TYPES",
    "RULER_FAMILIES",
    "Document",
    "Fit",
    "RulerConfig",
    "fit_to_length",
    "generate",
    "length_band",
    "load_hf_dataset",
    "load_jsonl",
    "make_document",
    "token_counter",
    "write_jsonl",
]
