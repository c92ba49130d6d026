"""The kvpress presses kvdrift offers, as *stages* with exact kept counts.

A stage is one kvpress press and kvdrift's budget rule for it. Scorer presses (SnapKV, Knorm,
...) choose entries by score; *families* wrap a scorer into a different shape of kept set:

==============  ==========================  =====================================================
family          kvpress press               what it keeps (n prompt entries, r = ratio kept)
==============  ==========================  =====================================================
(plain)         the scorer                  floor(r n) (or min(B, n)) in every layer and KV head
adakv           AdaKVPress                  kv_heads x floor(r n) per layer, split across heads
criticaladakv   CriticalAdaKVPress          as adakv, scores weighted by ||W_o v||
criticalkv      CriticalKVPress             as plain, scores weighted by ||W_o v||
block           BlockPress                  as plain, chosen block by block
rerotate        KeyRerotationPress          as plain, kept keys re-rotated to positions 0..k-1
chunk           ChunkPress                  floor(r len) of every chunk of chunk_length entries
chunkkv         ChunkKVPress                floor(r c) whole chunks of the c chunks
pyramidkv       PyramidKVPress              PyramidKV's layer budgets, layers x floor(r n) total
perlayer        PerLayerCompressionPress    floor(r_l n) in layer l (ratios=r_0/r_1/...)
decoding        DecodingPress               prefill untouched; every `interval` generated tokens
                                            the cache (prompt + generated) is cut to `target`
==============  ==========================  =====================================================

Head-adaptive presses (adakv, criticaladakv) keep every entry in the cache and name the ones
to hide per KV head (kvpress then writes "fake keys" over them during decoding); kvdrift reads
those names after prefill and masks the entries exactly instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import kvpress
import torch

# Short names of kvpress scorer presses: same count in every layer and KV head, no download.
SCORERS: dict[str, str] = {
    "snapkv": "SnapKVPress",
    "knorm": "KnormPress",
    "streaming_llm": "StreamingLLMPress",
    "recent": "StreamingLLMPress",
    "tova": "TOVAPress",
    "expected_attention": "ExpectedAttentionPress",
    "observed_attention": "ObservedAttentionPress",
    "random": "RandomPress",
    "keydiff": "KeyDiffPress",
    "lagkv": "LagKVPress",
    "cur": "CURPress",
    "leverage": "LeverageScorePress",
    "non_causal_attn": "NonCausalAttnPress",
    "cap": "CapPress",
}

# Scorers that read the attention weights of the layer: eager attention in prefill only.
NEEDS_ATTENTION_WEIGHTS = frozenset({"ObservedAttentionPress"})

# kvpress presses kvdrift does not offer, and why (shown when a user names one).
NOT_OFFERED: dict[str, str] = {
    "QFilterPress": "its Q-filters are downloaded from the Hugging Face hub (runs are offline)",
    "DuoAttentionPress": "its attention-head patterns are downloaded from the Hugging Face hub",
    "KVzapPress": "its scoring model is downloaded from the Hugging Face hub",
    "ExpectedAttentionStatsPress": "its query statistics are downloaded from the hub",
    "RestoreKVPress": "its restore model is downloaded from the Hugging Face hub",
    "FastKVzipPress": "its gates are downloaded from the Hugging Face hub",
    "KVzipPress": "it re-runs the context through the model (not a single prefill)",
    "KVgradPress": "it re-runs the context through the model with gradients",
    "FinchPress": "it needs a delimiter token between context and question in the prompt",
    "ThinKPress": "it prunes key channels, not entries (no kept set of entries)",
    "MergingPress": "it merges evicted entries into kept ones (values change, not a kept set)",
    "CAMPress": "it merges entries during decoding (values change, not a kept set)",
    "DMSPress": "its kept count follows a score threshold, not a budget",
    "SimLayerKVPress": "its kept count follows a per-layer laziness threshold, not a budget",
    "KVComposePress": "it keeps a count that follows its own aggregation, not a budget",
    "LUKVPress": "its budget curves are fitted offline",
    "EntropyGatedChunkKVPress": "its chunk sizes follow an entropy threshold, not a budget",
    "CompactorPress": "its internal leverage and attention sub-presses do not take a budget",
    "CompressionRatioDecodingPress": "use decoding-<scorer> (DecodingPress) with target=",
    "ComposedPress": "join actions with '+' instead, e.g. snapkv:ratio=0.5+knorm:ratio=0.8",
    "PrefillDecodingPress": "join a prefill action and a decoding one with '+', e.g. "
                            "snapkv:ratio=0.5+decoding-knorm:interval=32,target=256",
}


@dataclass(frozen=True)
class Family:
    """A way of turning a scorer into a kept set (one row of the module's table)."""

    name: str  # spec prefix ("adakv" in "adakv-snapkv"); "" for a plain scorer
    press: str | None  # kvpress class wrapping the scorer (None: the scorer itself)
    keeps: str  # what it keeps, for the README table and ``--actions help``
    fields: tuple[tuple[str, str], ...] = ()  # spec field -> kvpress field of the wrapper
    budget: str = "ratio"  # "ratio" (ratio= or budget=), "ratio-only", "ratios", "target"
    head_adaptive: bool = False

    @property
    def field_map(self) -> dict[str, str]:
        return dict(self.fields)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("", None, "floor(r n) (or min(B, n)) entries in every layer and KV head"),
    Family("adakv", "AdaKVPress", "kv_heads x floor(r n) entries per layer, split across KV "
           "heads by score (each head keeps at least alpha_safeguard of floor(r n))",
           (("alpha_safeguard", "alpha_safeguard"),), head_adaptive=True),
    Family("criticaladakv", "CriticalAdaKVPress", "as adakv, with scores weighted by the "
           "output-projected value norm", (("alpha_safeguard", "alpha_safeguard"),
                                           ("epsilon", "epsilon"),
                                           ("first_stage_ratio", "first_stage_ratio")),
           head_adaptive=True),
    Family("criticalkv", "CriticalKVPress", "floor(r n) in every layer and KV head, scores "
           "weighted by the output-projected value norm",
           (("epsilon", "epsilon"), ("first_stage_ratio", "first_stage_ratio"))),
    Family("block", "BlockPress", "floor(r n) in every layer and KV head, chosen block by block",
           (("block_size", "block_size"),)),
    Family("rerotate", "KeyRerotationPress", "floor(r n) in every layer and KV head; kept keys "
           "are re-rotated to positions 0..kept-1"),
    Family("chunk", "ChunkPress", "floor(r len) (at least 1) of every chunk of chunk_length "
           "entries, in every layer and KV head", (("chunk_length", "chunk_length"),),
           budget="ratio-only"),
    Family("chunkkv", "ChunkKVPress", "floor(r c) (at least 1) whole chunks of the c chunks of "
           "chunk_length entries, the same in every layer and KV head",
           (("chunk_length", "chunk_length"),), budget="ratio-only"),
    Family("pyramidkv", None, "PyramidKV's per-layer budgets (more in lower layers), "
           "layers x floor(r n) in total; SnapKV scores"),
    Family("perlayer", "PerLayerCompressionPress", "floor(r_l n) entries in layer l, every KV "
           "head (ratios=r_0/r_1/... one per layer)", budget="ratios"),
    Family("decoding", "DecodingPress", "prompt untouched at prefill; after every `interval` "
           "generated tokens the row's cache (prompt + generated) is cut to `target` entries "
           "per layer and KV head", (("interval", "compression_interval"),
                                     ("target", "target_size"),
                                     ("buffer", "hidden_states_buffer_size")),
           budget="target"),
)}

PYRAMIDKV = "PyramidKVPress"


def scorer_classes() -> dict[str, type]:
    """Offered scorer class names -> classes (those present in the installed kvpress)."""
    names = sorted(set(SCORERS.values()))
    return {name: getattr(kvpress, name) for name in names if hasattr(kvpress, name)}


def scorer_fields(scorer: str) -> dict[str, dataclasses.Field]:
    """User-settable fields of a scorer class (``compression_ratio`` is set by the budget)."""
    cls = getattr(kvpress, scorer)
    return {f.name: f for f in dataclasses.fields(cls)
            if f.init and not f.name.startswith("_") and f.name != "compression_ratio"}


def allowed_scorers() -> str:
    short = ", ".join(sorted(k for k, v in SCORERS.items() if v in scorer_classes()))
    return f"{short} (or a kvpress class name: {', '.join(scorer_classes())})"


def resolve_scorer(name: str) -> str:
    """Map a short scorer name or kvpress class name to the class name, or raise ValueError."""
    classes = scorer_classes()
    if name in classes:
        return name
    if name in NOT_OFFERED:
        raise ValueError(f"kvpress's {name} is not offered: {NOT_OFFERED[name]}")
    key = name.strip().lower().replace("-", "_")
    if key in SCORERS and SCORERS[key] in classes:
        return SCORERS[key]
    raise ValueError(f"unknown press {name!r}; allowed scorers: {allowed_scorers()}; "
                     f"families: {', '.join(f for f in FAMILIES if f)}")


def _exact_floor(ratio: float, n: int) -> int:
    """floor(ratio * n) in exact decimal arithmetic (floor(0.9 * 10) must be 9)."""
    return math.floor(Fraction(repr(ratio)) * n)


def mid_ratio(kept: int, n: int) -> float:
    """kvpress ``compression_ratio`` under which ``int(n * (1 - r))`` is exactly ``kept``.

    ``r = 1 - (kept + 1/2) / n`` lands ``n * (1 - r)`` mid-way between ``kept`` and
    ``kept + 1``, safe from float error.
    """
    return 0.0 if kept >= n else 1.0 - (kept + 0.5) / n


PRESS_SEED = 0


@contextlib.contextmanager
def fixed_press_randomness(device: torch.device) -> Iterator[None]:
    """Run a press with its random numbers drawn from ``PRESS_SEED``.

    Some presses draw them (LeverageScorePress sketches keys with ``torch.randn``); a fixed seed
    makes an action evict the same entries in every run and for every row of a batch. The
    caller's random state is restored afterwards.
    """
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda \
        else None
    with torch.random.fork_rng(devices=[index] if cuda else []):
        torch.default_generator.manual_seed(PRESS_SEED)
        if cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(PRESS_SEED)
        yield


@contextlib.contextmanager
def _quiet_kvpress() -> Iterator[None]:
    """Hide kvpress's construction-time warnings (e.g. PerLayerCompressionPress's)."""
    log = logging.getLogger("kvpress")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@dataclass(frozen=True)
class Stage:
    """One kvpress press with kvdrift's exact budget rule.

    ``ratio`` is the fraction *kept* (``floor(ratio * n)``, at least 1), ``budget`` a fixed
    count (``min(budget, n)``), ``ratios`` per-layer fractions kept (``perlayer``) and
    ``kwargs`` the press fields as sorted ``(spec name, value)`` pairs (family fields by their
    spec names, e.g. ``interval``; the rest are the scorer's).
    """

    family: str
    scorer: str
    ratio: float | None = None
    budget: int | None = None
    ratios: tuple[float, ...] | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        fam = FAMILIES.get(self.family)
        if fam is None:
            raise ValueError(f"unknown press family {self.family!r}; allowed: "
                             f"{', '.join(repr(f) for f in FAMILIES)}")
        label = f"{self.family}-{self.scorer}" if self.family else self.scorer
        given = [k for k, v in (("ratio", self.ratio), ("budget", self.budget),
                                ("ratios", self.ratios)) if v is not None]
        wanted = {"ratio": ["ratio", "budget"], "ratio-only": ["ratio"], "ratios": ["ratios"],
                  "target": []}[fam.budget]
        if fam.budget == "target":
            if given:
                raise ValueError(f"{label}: a decoding press takes target= (entries kept per "
                                 f"layer and KV head) and interval=, not {given[0]}=")
            if "target" not in dict(self.kwargs):
                raise ValueError(f"{label}: give target=T (entries kept after each decoding-time "
                                 f"compression, >= 1) and interval=I (generated tokens between "
                                 f"compressions)")
        elif len(given) != 1 or given[0] not in wanted:
            options = " or ".join(f"{w}=" for w in wanted)
            raise ValueError(f"{label}: give exactly one of {options} (ratio: fraction of entries "
                             f"kept, in (0, 1]; budget: entries kept, >= 1; ratios: one kept "
                             f"fraction per layer, r_0/r_1/...)")
        if self.ratio is not None:
            ratio = float(self.ratio)
            if not 0.0 < ratio <= 1.0:
                raise ValueError(f"{label}: ratio (fraction of entries kept) must be in (0, 1]; "
                                 f"got {self.ratio}")
            object.__setattr__(self, "ratio", ratio)
        if self.budget is not None:
            if isinstance(self.budget, bool) or int(self.budget) != self.budget or self.budget < 1:
                raise ValueError(f"{label}: budget (entries kept) must be an integer >= 1; "
                                 f"got {self.budget}")
            object.__setattr__(self, "budget", int(self.budget))
        if self.ratios is not None:
            ratios = tuple(float(r) for r in self.ratios)
            if not ratios or any(not 0.0 < r <= 1.0 for r in ratios):
                raise ValueError(f"{label}: ratios (fraction kept per layer) must each be in "
                                 f"(0, 1]; got {list(self.ratios)}")
            object.__setattr__(self, "ratios", ratios)
        allowed = {**{k: None for k in fam.field_map},
                   **{k: None for k in scorer_fields(self.scorer)}}
        for key, value in self.kwargs:
            if key not in allowed:
                raise ValueError(f"{label}: unknown field {key!r}; allowed: "
                                 f"{', '.join(allowed) or 'none'} (plus ratio= or budget=)")
            if key in ("interval", "target", "block_size", "chunk_length") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{label}: {key} must be an integer >= 1; got {value!r}")
            if key == "buffer" and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{label}: buffer (hidden states kept for scoring) must be an "
                                 f"integer >= 0; got {value!r}")
        object.__setattr__(self, "kwargs", tuple(sorted(self.kwargs)))

    # --- what it keeps ------------------------------------------------------------------
    @property
    def label(self) -> str:
        return f"{self.family}-{self.scorer}" if self.family else self.scorer

    @property
    def is_decoding(self) -> bool:
        return self.family == "decoding"

    @property
    def head_adaptive(self) -> bool:
        return FAMILIES[self.family].head_adaptive

    @property
    def needs_attention_weights(self) -> bool:
        return self.scorer in NEEDS_ATTENTION_WEIGHTS

    def field(self, name: str, default: Any = None) -> Any:
        """A spec field's value, or the kvpress default of the press it belongs to."""
        given = dict(self.kwargs)
        if name in given:
            return given[name]
        fam = FAMILIES[self.family]
        if name in fam.field_map:
            cls = getattr(kvpress, fam.press)
            for f in dataclasses.fields(cls):
                if f.name == fam.field_map[name] and f.default is not dataclasses.MISSING:
                    return f.default
            return default
        fields = scorer_fields(self.scorer)
        if name in fields and fields[name].default is not dataclasses.MISSING:
            return fields[name].default
        return default

    @property
    def uniform(self) -> bool:
        """Whether every layer and KV head keeps one count that depends only on n."""
        return not self.head_adaptive and self.family not in ("perlayer", "pyramidkv",
                                                                "chunkkv", "decoding")

    def kept(self, n: int) -> int:
        """Entries kept per KV head (on average over heads for head-adaptive presses)."""
        if self.family in ("perlayer", "pyramidkv", "chunkkv"):
            raise ValueError(f"{self.label} keeps no single count per KV head (see "
                             f"check_counts)")
        if self.family == "chunk":
            return sum(max(1, _exact_floor(self.ratio, c)) for c in self.chunks(n))
        if self.budget is not None:
            return min(self.budget, n)
        if self.ratio is not None:
            return min(n, max(1, _exact_floor(self.ratio, n)))
        return n  # decoding and perlayer: see their own rules

    def chunks(self, n: int) -> list[int]:
        """Lengths of the chunks of ``chunk_length`` a prompt of ``n`` entries falls into."""
        size = int(self.field("chunk_length"))
        return [min(size, n - i) for i in range(0, n, size)]

    def is_noop(self, n: int) -> bool:
        """Whether nothing is evicted at prefill for a prompt of ``n`` entries."""
        if self.is_decoding:
            return True
        if self.family == "perlayer":
            return all(_exact_floor(r, n) >= n for r in self.ratios or ())
        if self.family == "chunkkv":
            return self._chunks_kept(n) >= len(self.chunks(n))
        if self.family == "pyramidkv":
            return self.ratio == 1.0 or (self.budget is not None and self.budget >= n)
        return self.kept(n) >= n

    def _pyramid_mean(self, n: int) -> int:
        """PyramidKV's mean layer budget: floor(r n) or min(B, n)."""
        if self.budget is not None:
            return min(self.budget, n)
        return min(n, max(1, _exact_floor(self.ratio, n)))

    def _chunks_kept(self, n: int) -> int:
        return max(1, _exact_floor(self.ratio, len(self.chunks(n))))

    def expected_counts(self, n: int, n_layers: int, config: Any) -> list[int] | None:
        """Entries each KV head of each layer keeps after prefill (None: head-adaptive)."""
        if self.head_adaptive:
            return None
        if self.family == "perlayer":
            if len(self.ratios) != n_layers:
                raise ValueError(f"{self.label}: ratios has {len(self.ratios)} values; the model "
                                 f"has {n_layers} layers (give one kept fraction per layer)")
            return [min(n, max(1, _exact_floor(r, n))) for r in self.ratios]
        if self.family == "pyramidkv":
            press = self.build(n)
            return [press.get_layer_budget(SimpleNamespace(layer_idx=i, config=config), n)
                    for i in range(n_layers)]
        return [self.kept(n)] * n_layers  # chunkkv is checked by check_counts

    def check_counts(self, n: int, counts: Any, config: Any) -> None:
        """Raise RuntimeError unless ``counts`` ``[layers, kv_heads]`` is what this promises."""
        n_layers, kv = counts.shape
        rows = counts.tolist()
        if self.head_adaptive:
            want = kv * self.kept(n)
            for i, row in enumerate(rows):
                if sum(row) != want:
                    raise RuntimeError(f"{self.label}: layer {i} keeps {sum(row)} entries over "
                                       f"its {kv} KV heads, expected {want}")
            return
        if self.family == "chunkkv":
            k, chunks = self._chunks_kept(n), self.chunks(n)
            allowed = {k * chunks[0], (k - 1) * chunks[0] + chunks[-1]}
            for i, row in enumerate(rows):
                if len(set(row)) != 1 or row[0] not in allowed:
                    raise RuntimeError(f"{self.label}: layer {i} keeps {row} entries per KV head, "
                                       f"expected {k} whole chunks ({sorted(allowed)} entries)")
            return
        expected = self.expected_counts(n, n_layers, config)
        if self.family == "pyramidkv" and sum(expected) != n_layers * self._pyramid_mean(n):
            raise RuntimeError(f"{self.label}: PyramidKV's layer budgets {expected} do not add "
                               f"up to {n_layers} x {self._pyramid_mean(n)}")
        for i, (row, want) in enumerate(zip(rows, expected, strict=True)):
            if any(c != want for c in row):
                raise RuntimeError(f"{self.label}: layer {i} keeps {row} entries per KV head, "
                                   f"expected {want}")

    # --- the kvpress press --------------------------------------------------------------
    def scorer_press(self, compression_ratio: float = 0.0) -> Any:
        """A fresh scorer press with this stage's scorer fields."""
        fam = FAMILIES[self.family]
        fields = scorer_fields(self.scorer)
        kwargs = {k: v for k, v in self.kwargs if k not in fam.field_map and k in fields}
        return getattr(kvpress, self.scorer)(compression_ratio=compression_ratio, **kwargs)

    def build(self, n: int) -> Any:
        """A fresh kvpress press for a prompt of ``n`` entries (fields that kvpress requires
        below the prompt length, such as SnapKV's ``window_size``, are clamped to ``n - 1``)."""
        fam = FAMILIES[self.family]
        wrapper_kwargs = {fam.field_map[k]: v for k, v in self.kwargs if k in fam.field_map}
        with _quiet_kvpress():
            if self.family == "pyramidkv":
                return self.clamped_scorer(n, 1.0 - self._pyramid_mean(n) / n)
            if self.family == "perlayer":
                ratios = [mid_ratio(min(n, max(1, _exact_floor(r, n))), n) for r in self.ratios]
                return kvpress.PerLayerCompressionPress(press=self.clamped_scorer(n, 0.0),
                                                        compression_ratios=ratios)
            if self.family == "decoding":
                return kvpress.DecodingPress(base_press=self.scorer_press(), **wrapper_kwargs)
            if self.family == "chunkkv":
                chunks = len(self.chunks(n))
                ratio = mid_ratio(self._chunks_kept(n), chunks)
            elif self.family == "chunk":
                # int(len * (1 - r)) must be floor(ratio * len) for every chunk length
                ratio = 1.0 - self.ratio - 1e-9 if self.ratio < 1.0 else 0.0
            else:
                ratio = mid_ratio(self.kept(n), n)
            scorer = self.clamped_scorer(n, ratio)
            if fam.press is None:
                return scorer
            return getattr(kvpress, fam.press)(press=scorer, **wrapper_kwargs)

    def clamped_scorer(self, n: int, compression_ratio: float) -> Any:
        """A fresh scorer press for ``n`` entries, with ``window_size`` and ``n_sink`` clamped
        to ``n - 1`` (kvpress asserts on shorter inputs: this is kvdrift's documented fallback
        for short prompts)."""
        press = self.scorer_press(compression_ratio)
        for key in ("window_size", "n_sink"):
            value = getattr(press, key, None)
            if isinstance(value, int) and value >= n:
                setattr(press, key, n - 1)
        return press


def family_table() -> list[tuple[str, str, str]]:
    """(spec form, kvpress press, what it keeps) for every offered family."""
    rows = []
    for fam in FAMILIES.values():
        if fam.name == "":
            rows.append(("<scorer>:ratio=R | budget=B", "the scorer (see below)", fam.keeps))
        elif fam.name == "pyramidkv":
            rows.append(("pyramidkv:ratio=R | budget=B", PYRAMIDKV, fam.keeps))
        elif fam.budget == "ratios":
            rows.append((f"{fam.name}-<scorer>:ratios=R0/R1/...", fam.press, fam.keeps))
        elif fam.budget == "target":
            rows.append((f"{fam.name}-<scorer>:interval=I,target=T", fam.press, fam.keeps))
        else:
            budget = "ratio=R" if fam.budget == "ratio-only" else "ratio=R | budget=B"
            rows.append((f"{fam.name}-<scorer>:{budget}", fam.press, fam.keeps))
    return rows
