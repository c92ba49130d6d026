"""A study's document sources: one small class per ``[[documents]]`` table kind.

A study config is parsed once into these (:func:`source_from_table`), so the runner asks a
source for its documents instead of re-reading the table. ``as_dict`` gives the table back
exactly as it was written (same keys, values and key order): a study directory records it in
``run.json`` and compares it on resume.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvdrift import checks
from kvdrift.data.document import CONTEXT_THEN_QUESTION, WHOLE_PROMPT, Document
from kvdrift.data.loaders import (
    document_record,
    documents_from_records,
    load_hf_dataset,
    load_jsonl,
)
from kvdrift.data.ruler import RulerConfig, generate
from kvdrift.data.sizing import token_counter


@dataclass(frozen=True)
class DocumentSource(ABC):
    """A source of documents and the config table it came from.

    ``table_keys`` are the table's keys in the order written, so that ``as_dict`` writes the
    table back byte for byte; ``None`` (a source built in code) writes every key that has a
    value. A key may be left out only where the source holds that key's default. Equality
    ignores it: sources that yield the same documents are equal, however the table was written.
    """

    kind: ClassVar[str]  # the table's ``source`` value
    needs_tokenizer: ClassVar[bool] = False  # sized with each model's tokenizer
    table_keys: tuple[str, ...] | None = field(default=None, kw_only=True, compare=False)

    def __post_init__(self) -> None:
        if self.table_keys is None:
            return
        keys = tuple(self.table_keys)
        object.__setattr__(self, "table_keys", keys)
        values, defaults = self._values(), self._defaults()
        if len(set(keys)) != len(keys) or not set(keys) <= set(values):
            raise ValueError(f"{self.kind} source: table_keys {list(keys)} must be distinct "
                             f"keys of {list(values)}")
        for key, value in values.items():
            if key in keys and value is None:
                raise ValueError(f"{self.kind} source: key {key!r} is listed but has no value")
            if key in keys or value is None:
                continue
            if key not in defaults:
                raise ValueError(f"{self.kind} source: key {key!r} has no default and must be "
                                 "in table_keys")
            if value != defaults[key]:
                raise ValueError(f"{self.kind} source: key {key!r} is left out of table_keys "
                                 f"but its value {value!r} is not the default")

    @abstractmethod
    def documents(self, tokenizer: Any = None) -> list[Document]:
        """The source's documents; ``tokenizer`` (or a ``str -> int`` counter) is used only
        where :attr:`needs_tokenizer` is true."""

    @abstractmethod
    def _values(self) -> dict[str, Any]:
        """Every key the table kind allows, in the canonical order, with this source's value
        as the table holds it (``None`` for an option that is not set)."""

    def _defaults(self) -> dict[str, Any]:
        """The keys a table may leave out while holding a value, with their defaults."""
        return {}

    @property
    def protocol(self) -> str:
        """The protocol of the documents a generator makes (fixed ones say per document)."""
        return WHOLE_PROMPT

    def as_dict(self) -> dict[str, Any]:
        """The config table of this source, as a study directory records it."""
        values = self._values()
        keys = self.table_keys
        if keys is None:
            keys = tuple(k for k, v in values.items() if v is not None)
        return {key: values[key] for key in keys}


@dataclass(frozen=True)
class JsonlSource(DocumentSource):
    """Documents from a JSON Lines file (see :func:`kvdrift.data.load_jsonl`)."""

    kind: ClassVar[str] = "jsonl"
    path: str

    def documents(self, tokenizer: Any = None) -> list[Document]:
        """The file's documents (read on every call; ``tokenizer`` is ignored)."""
        return load_jsonl(self.path)

    def _values(self) -> dict[str, Any]:
        return {"source": self.kind, "path": self.path}


@dataclass(frozen=True)
class RecordsSource(DocumentSource):
    """Documents handed over in memory (``kvdrift.measure(docs=[{...}])``), checked as JSONL
    lines are (:func:`kvdrift.data.loaders.documents_from_records`); a store records them
    whole, so a resume with other documents is refused."""

    kind: ClassVar[str] = "records"
    docs: tuple[Document, ...]

    def documents(self, tokenizer: Any = None) -> list[Document]:
        """The documents (``tokenizer`` is ignored)."""
        return list(self.docs)

    def _values(self) -> dict[str, Any]:
        return {"source": self.kind, "documents": [document_record(d) for d in self.docs]}

    @classmethod
    def from_records(cls, records: Any, where: str = "docs",
                     table_keys: tuple[str, ...] | None = None) -> RecordsSource:
        """The source of document objects (each as a JSONL line gives it)."""
        return cls(tuple(documents_from_records(records, where)), table_keys=table_keys)


@dataclass(frozen=True)
class HFSource(DocumentSource):
    """Documents from a Hugging Face dataset (see :func:`kvdrift.data.load_hf_dataset`)."""

    kind: ClassVar[str] = "hf"
    name: str
    split: str
    prompt_field: str
    id_field: str | None = None
    stratum_field: str | None = None
    stratum: str | None = None
    answer_field: str | None = None
    limit: int | None = None
    question_field: str | None = None  # prompt_field is then the context (kvpress's protocol)

    def documents(self, tokenizer: Any = None) -> list[Document]:
        """The dataset's documents (loaded on every call; ``tokenizer`` is ignored)."""
        return load_hf_dataset(
            self.name, self.split, self.prompt_field, id_field=self.id_field,
            stratum_field=self.stratum_field, stratum=self.stratum, limit=self.limit,
            answer_field=self.answer_field, question_field=self.question_field)

    def _values(self) -> dict[str, Any]:
        return {"source": self.kind, "name": self.name, "split": self.split,
                "prompt_field": self.prompt_field, "id_field": self.id_field,
                "stratum_field": self.stratum_field, "stratum": self.stratum,
                "answer_field": self.answer_field, "limit": self.limit,
                "question_field": self.question_field}

    def _defaults(self) -> dict[str, Any]:
        return dict.fromkeys(("id_field", "stratum_field", "stratum", "answer_field", "limit",
                              "question_field"))


#: Table key -> RulerConfig field of a ``source = "ruler"`` table, in the table's order.
RULER_TABLE_FIELDS = {"families": "families", "needle_types": "needle_types",
                      "lengths": "target_lengths", "per_stratum": "documents_per_stratum",
                      "seed": "seed", "question_after": "question_after"}


def _ruler_values(config: RulerConfig) -> dict[str, Any]:
    """A RULER table's values from a generator config (sequences as the lists TOML gives)."""
    values: dict[str, Any] = {"source": RulerSource.kind}
    for key, name in RULER_TABLE_FIELDS.items():
        value = getattr(config, name)
        values[key] = list(value) if isinstance(value, tuple) else value
    return values


@dataclass(frozen=True)
class RulerSource(DocumentSource):
    """Built-in RULER-style documents, generated offline and sized with each model's
    tokenizer (see :func:`kvdrift.data.generate`)."""

    kind: ClassVar[str] = "ruler"
    needs_tokenizer: ClassVar[bool] = True
    config: RulerConfig = field(default_factory=RulerConfig)

    def documents(self, tokenizer: Any = None) -> list[Document]:
        """The generated documents, each fitted to its token budget under ``tokenizer``."""
        if tokenizer is None:
            raise TypeError("a RULER source needs a tokenizer (or a str -> int token counter) "
                            "to size its documents")
        return generate(self.config, token_counter(tokenizer))

    def _values(self) -> dict[str, Any]:
        return _ruler_values(self.config)

    @property
    def protocol(self) -> str:
        return CONTEXT_THEN_QUESTION if self.config.question_after else WHOLE_PROMPT


    def _defaults(self) -> dict[str, Any]:
        return _ruler_values(RulerConfig())

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> RulerSource:
        """The source of a ``source = "ruler"`` table; RulerConfig checks the values."""
        config = RulerConfig(**{name: table[key] for key, name in RULER_TABLE_FIELDS.items()
                                if key in table})
        return cls(config, table_keys=tuple(table))


def source_from_table(table: Mapping[str, Any], where: str = "[[documents]]") -> DocumentSource:
    """The typed source of one ``[[documents]]`` table whose keys and value types are
    already checked (``kvdrift.study_config``); raises ValueError on values a source refuses
    (``where`` names the table in a refused document's error)."""
    kind = checks.choice(table.get("source"), "document source",
                         (c.kind for c in (RulerSource, JsonlSource, HFSource, RecordsSource)))
    keys = tuple(table)
    if kind == JsonlSource.kind:
        return JsonlSource(table["path"], table_keys=keys)
    if kind == RecordsSource.kind:
        return RecordsSource.from_records(table["documents"], f"{where}.documents", keys)
    if kind == HFSource.kind:
        return HFSource(**{k: v for k, v in table.items() if k != "source"}, table_keys=keys)
    return RulerSource.from_table(table)
