"""The kvpress presses kvdrift offers, as *stages* with exact kept counts.

A stage is one kvpress press and kvdrift's budget rule for it. Scorer presses (SnapKV, Knorm,
...) choose entries by score; *families* wrap a scorer into a different shape of kept set. Each
family is one :class:`Family` object in the registry :data:`FAMILIES` (its name, its kvpress
wrapper class, its fields, what it keeps, how its counts are checked, how its press is built,
its departures); a :class:`Stage` holds its family object and asks it. Names are strings only
where a user's spec is parsed (:mod:`kvdrift.lm.actions.spec`):

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
chunkkv         ChunkKVPress                floor(r c) whole chunks of the c chunks (n < chunk:
                                            floor(r n), the scorer alone, as kvpress)
pyramidkv       PyramidKVPress              kvpress's layer budgets for compression_ratio 1 - r
perlayer        PerLayerCompressionPress    floor(r_l n) in layer l (ratios=r_0/r_1/...)
decoding        DecodingPress               prefill untouched; every `interval` generated tokens
                                            the cache (prompt + generated) is cut to `target`
decoding-adakv  DecodingPress(AdaKVPress)   as decoding, all but `target` per KV head on average
                                            hidden per head instead of cut
cam             CAMPress                    as decoding, evicted values merged into kept ones
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
from typing import Any, ClassVar

import kvpress
import torch

from kvdrift import checks
from kvdrift.lm.grammar import stages
from kvdrift.lm.grammar.fields import check_field, check_field_name
from kvdrift.lm.grammar.stages import budget_problem

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
NEEDS_ATTENTION_WEIGHTS: frozenset[type] = frozenset(
    getattr(kvpress, name) for name in stages.NEEDS_ATTENTION_WEIGHTS)

# Wrappers that cannot take a scorer reading attention weights, and why (kvpress asserts).
REFUSES_ATTENTION_WEIGHTS: dict[type, str] = {
    getattr(kvpress, name): why for name, why in stages.REFUSES_ATTENTION_WEIGHTS.items()}


def wrapper_problem(wrapper: type | None, scorer: type) -> str | None:
    """Why the kvpress press class ``wrapper`` cannot wrap the scorer class ``scorer``, or
    None (a scorer reading attention weights inside a wrapper that refuses them: the rule of
    :func:`kvdrift.lm.grammar.stages.weights_problem`, for the classes they subclass)."""
    if wrapper is None or scorer not in NEEDS_ATTENTION_WEIGHTS:
        return None
    refusing = next((cls for cls in REFUSES_ATTENTION_WEIGHTS if issubclass(wrapper, cls)), None)
    if refusing is None:
        return None
    return stages.weights_problem(wrapper.__name__, scorer.__name__, refusing.__name__)


# kvpress presses that kvdrift cannot measure, and why (shown when a user names one).
NOT_OFFERED: dict[str, str] = {
    "FinchPress": "it deletes its delimiter token from the prompt inside the model, so Q would "
                  "read another prompt, at other positions, than P",
}

_HUB = ("hub-trained: runs when its files are in the local Hugging Face cache, under the hub "
        "id it builds from the model's name (a model loaded from a local folder has none: a "
        "missing file is named with how to supply it)")
_TOKENIZER = "reads the model's tokenizer from model.config.name_or_path (a model folder or hub id)"

# kvpress presses measured as press objects through the general path (lm/engine/press_path.py): what
# each does to Q's cache, and an object to start from (give it in a presses file or presses=).
GENERAL_PATH: dict[str, str] = {
    "ThinKPress": "prunes key channels (stored as zeros; kv_fraction counts the channels kept): "
                  "ThinKPress(key_channel_compression_ratio=0.5)",
    "MergingPress": "merges evicted values into kept entries (values change): "
                    "MergingPress(press=KnormPress(compression_ratio=0.5))",
    "DMSPress": "hides entries whose score is below a threshold as they leave its sliding "
                "window, per KV head, at prefill and (decoding=True) during generation: "
                "DMSPress(press=KnormPress(), threshold=-5.0, sliding_window_size=128)",
    "SimLayerKVPress": "keeps only sink and recent entries in lazy layers: "
                       "SimLayerKVPress(lazy_threshold=0.9)",
    "KVComposePress": "re-runs the prompt with eager attention and keeps a composite per layer "
                      "when its context exits: KVComposePress(compression_ratio=0.5)",
    "CompactorPress": "blends leverage and non-causal attention scores over the prompt: "
                      "CompactorPress(compression_ratio=0.5)",
    "KVzipPress": "re-runs the context to score entries, when its context exits; " + _TOKENIZER
                  + ": KVzipPress(compression_ratio=0.5)",
    "KVgradPress": "as KVzip, with gradients; " + _TOKENIZER
                   + ": KVgradPress(compression_ratio=0.5)",
    "EntropyGatedChunkKVPress": "chunk sizes follow an entropy threshold: "
                                "EntropyGatedChunkKVPress(press=SnapKVPress(compression_ratio=0.5))",
    "DuoAttentionPress": "hides the middle of streaming heads; it fetches its head pattern over "
                         "HTTP (GitHub) by the model's name, so offline it runs only with the "
                         "pattern supplied beforehand (kvpress.presses.duo_attention_press."
                         "cache[model.config.name_or_path] = (sink, recent, head_scores)): "
                         "DuoAttentionPress(head_compression_ratio=0.5)",
    "LUKVPress": "allocates per-head budgets from a curve it fetches over HTTP (GitHub); offline "
                 "it runs with the curve supplied beforehand (press._budget_curves = an array "
                 "[99, layers, kv_heads] of prune ratios, one slice per percent compressed): "
                 "LUKVPress(press=ExpectedAttentionPress(epsilon=2e-2))",
    "QFilterPress": _HUB + ": QFilterPress(compression_ratio=0.5)",
    "KVzapPress": _HUB + ": KVzapPress(...)",
    "ExpectedAttentionStatsPress": _HUB + ": ExpectedAttentionStatsPress(...)",
    "RestoreKVPress": _HUB + ": RestoreKVPress(...)",
    "FastKVzipPress": _HUB + ": FastKVzipPress(...)",
    "ComposedPress": "presses in sequence (as a spec: join actions with '+', e.g. "
                     "snapkv:ratio=0.5+knorm:ratio=0.8)",
    "PrefillDecodingPress": "a prefill press, then a DecodingPress during generation (as a spec: "
                            "snapkv:ratio=0.5+decoding-knorm:interval=32,target=256)",
}


def not_a_spec(name: str) -> str | None:
    """Why the kvpress class ``name`` is not a spec, if it is one kvdrift does not parse:
    refused (:data:`NOT_OFFERED`) or measured as a press object (:data:`GENERAL_PATH`)."""
    if name in NOT_OFFERED:
        return f"kvpress's {name} is not offered: {NOT_OFFERED[name]}"
    if name in GENERAL_PATH:
        return (f"kvpress's {name} is measured as a press object, not a spec: give it under an "
                f"action name in a presses file (--presses) or in presses= from Python; it "
                f"{GENERAL_PATH[name]}")
    return None


@dataclass(frozen=True)
class Family:
    """A way of turning a scorer into a kept set (one row of the module's table).

    This base class keeps ``floor(r n)`` (or ``min(B, n)``) entries in every layer and KV head,
    with the scorer wrapped in ``press`` when there is one (``criticalkv``, ``block``,
    ``rerotate``). Each other family is a subclass that overrides what it keeps, how its kept
    counts are checked and how its kvpress press is built; :class:`Stage` asks its family.
    ``press`` is the kvpress class itself, so a stage builds it without looking it up by name.
    """

    name: str  # spec prefix ("adakv" in "adakv-snapkv"); "" for a plain scorer
    press: type | None  # kvpress class wrapping the scorer (None: the scorer itself)
    keeps: str  # what it keeps, for the table in docs/actions.md and ``--actions help``
    fields: tuple[tuple[str, str], ...] = ()  # spec field -> kvpress field of the wrapper
    departs: str = ""  # where kvdrift departs from the kvpress press on purpose (one line)

    budgets: ClassVar[tuple[str, ...]] = ("ratio", "budget")  # exactly one of these is given
    head_adaptive: ClassVar[bool] = False  # kept entries differ per KV head (masked, not cut)
    uniform: ClassVar[bool] = True  # every layer and KV head keeps one count that depends on n
    is_decoding: ClassVar[bool] = False  # evicts during decoding, not at prefill
    also_presses: ClassVar[dict[str, str]] = {}  # other kvpress classes it builds -> spec form
    own_scorer: ClassVar[type | None] = None  # a family that is one fixed scorer press, named
    #                                          alone ("pyramidkv"), not "<family>-<scorer>"

    @property
    def field_map(self) -> dict[str, str]:
        return dict(self.fields)

    @property
    def press_name(self) -> str | None:
        """The wrapper press's kvpress class name (None: the scorer itself)."""
        return None if self.press is None else self.press.__name__

    @property
    def wraps_scorers(self) -> bool:
        """Whether specs name it as a prefix, ``<family>-<scorer>`` (not plain, not own-scorer)."""
        return bool(self.name) and self.own_scorer is None

    def label(self, scorer: str) -> str:
        """How a stage of this family with ``scorer`` is named in messages."""
        return f"{self.name}-{scorer}" if self.name else scorer

    def wrapper_defaults(self) -> dict[str, Any]:
        """The wrapper's spec fields -> their kvpress defaults (``dataclasses.MISSING`` where
        kvpress gives none); empty for a family without a wrapper."""
        if self.press is None:
            return {}
        by_name = {f.name: f.default for f in dataclasses.fields(self.press)}
        return {spec: by_name.get(press) for spec, press in self.fields}

    def check_budget(self, stage: Stage, given: list[str]) -> None:
        """Raise ValueError unless ``given`` (the budget fields set) is one this family takes
        (the rule, known without kvpress: :func:`kvdrift.lm.grammar.stages.budget_problem`)."""
        problem = budget_problem(self.name, stage.label, given, stage.ratio,
                                 "target" in dict(stage.kwargs))
        if problem is not None:
            raise ValueError(problem)

    def kept(self, stage: Stage, n: int) -> int:
        """Entries kept per KV head (on average over heads for head-adaptive presses)."""
        return _ratio_or_budget(stage, n)

    def is_noop(self, stage: Stage, n: int) -> bool:
        return self.kept(stage, n) >= n

    def expected_counts(self, stage: Stage, n: int, n_layers: int, config: Any
                        ) -> list[int] | None:
        return [self.kept(stage, n)] * n_layers

    def check_counts(self, stage: Stage, n: int, counts: Any, config: Any) -> None:
        expected = self.expected_counts(stage, n, counts.shape[0], config)
        for i, (row, want) in enumerate(zip(counts.tolist(), expected, strict=True)):
            if any(c != want for c in row):
                raise RuntimeError(f"{stage.label}: layer {i} keeps {row} entries per KV head, "
                                   f"expected {want}")

    def compression_ratio(self, stage: Stage, n: int) -> float:
        """The scorer's kvpress ``compression_ratio`` for a prompt of ``n`` entries."""
        return press_ratio(stage, self.kept(stage, n), n)

    def build(self, stage: Stage, n: int) -> Any:
        scorer = stage.clamped_scorer(n, self.compression_ratio(stage, n))
        if self.press is None:
            return scorer
        return self.press(press=scorer, **self.wrapper_kwargs(stage))

    def kvpress_call(self, stage: Stage) -> str:
        """The kvpress press, as the Python call that rebuilds it from the user's numbers."""
        scorer = scorer_call(stage, user_ratio(stage))
        if self.press is None:
            return scorer
        wrapper = [f"{k}={v!r}" for k, v in self.wrapper_kwargs(stage).items()]
        return f"{self.press_name}({', '.join([f'press={scorer}', *wrapper])})"

    def wrapper_kwargs(self, stage: Stage) -> dict[str, Any]:
        """The wrapper press's fields, by their kvpress names."""
        return {self.field_map[k]: v for k, v in stage.kwargs if k in self.field_map}

    def table_row(self) -> tuple[str, str, str]:
        """(spec form, kvpress press, what it keeps) for :func:`family_table`."""
        forms = {"ratio": "ratio=R", "budget": "budget=B", "ratios": "ratios=R0/R1/..."}
        budget = " | ".join(forms[b] for b in self.budgets)
        return f"{self.name}-<scorer>:{budget}", self.press_name, self.keeps


class Plain(Family):
    """The scorer alone."""

    def table_row(self) -> tuple[str, str, str]:
        return "<scorer>:ratio=R | budget=B", "the scorer (see below)", self.keeps


class HeadAdaptive(Family):
    """``kv_heads x floor(r n)`` entries per layer, split across KV heads (adakv,
    criticaladakv): every entry stays stored and the hidden ones are masked."""

    head_adaptive = True
    uniform = False

    def expected_counts(self, stage: Stage, n: int, n_layers: int, config: Any) -> None:
        return None

    def check_counts(self, stage: Stage, n: int, counts: Any, config: Any) -> None:
        kv = counts.shape[1]
        want = kv * self.kept(stage, n)
        for i, row in enumerate(counts.tolist()):
            if sum(row) != want:
                raise RuntimeError(f"{stage.label}: layer {i} keeps {sum(row)} entries over "
                                   f"its {kv} KV heads, expected {want}")


class Chunk(Family):
    """``floor(r len)`` (at least 1) of every chunk of ``chunk_length`` entries."""

    budgets = ("ratio",)

    def kept(self, stage: Stage, n: int) -> int:
        return sum(max(1, _exact_floor(stage.ratio, c)) for c in stage.chunks(n))

    def compression_ratio(self, stage: Stage, n: int) -> float:
        # int(len * (1 - c)) must be floor(ratio * len) for every chunk length
        user = removed_fraction(Fraction(repr(stage.ratio)))
        if all(_kvpress_kept(c, user) == max(1, _exact_floor(stage.ratio, c))
               for c in set(stage.chunks(n))):
            return user
        return 1.0 - stage.ratio - 1e-9 if stage.ratio < 1.0 else 0.0


class Varying(Family):
    """A family whose kept count is not one number per KV head (see its check_counts)."""

    uniform = False

    def kept(self, stage: Stage, n: int) -> int:
        raise ValueError(f"{stage.label} keeps no single count per KV head (see check_counts)")


class ChunkKV(Varying):
    """``floor(r c)`` (at least 1) whole chunks of the ``c`` chunks, in every layer (a prompt
    shorter than one chunk: ``floor(r n)`` by the scorer alone, as kvpress does)."""

    budgets = ("ratio",)

    def expected_counts(self, stage: Stage, n: int, n_layers: int, config: Any
                        ) -> list[int] | None:
        if self.below_one_chunk(stage, n):
            return [_ratio_or_budget(stage, n)] * n_layers
        return None

    def chunks_kept(self, stage: Stage, n: int) -> int:
        return max(1, _exact_floor(stage.ratio, len(stage.chunks(n))))

    def below_one_chunk(self, stage: Stage, n: int) -> bool:
        """Whether ``n`` is shorter than one chunk: kvpress then runs the scorer alone."""
        return n < int(stage.field("chunk_length"))

    def is_noop(self, stage: Stage, n: int) -> bool:
        if self.below_one_chunk(stage, n):
            return _ratio_or_budget(stage, n) >= n
        return self.chunks_kept(stage, n) >= len(stage.chunks(n))

    def check_counts(self, stage: Stage, n: int, counts: Any, config: Any) -> None:
        if self.below_one_chunk(stage, n):
            Family.check_counts(self, stage, n, counts, config)
            return
        k, chunks = self.chunks_kept(stage, n), stage.chunks(n)
        allowed = {k * chunks[0], (k - 1) * chunks[0] + chunks[-1]}
        for i, row in enumerate(counts.tolist()):
            if len(set(row)) != 1 or row[0] not in allowed:
                raise RuntimeError(f"{stage.label}: layer {i} keeps {row} entries per KV head, "
                                   f"expected {k} whole chunks ({sorted(allowed)} entries)")

    def compression_ratio(self, stage: Stage, n: int) -> float:
        if self.below_one_chunk(stage, n):
            return press_ratio(stage, _ratio_or_budget(stage, n), n)
        return press_ratio(stage, self.chunks_kept(stage, n), len(stage.chunks(n)))


class PyramidKV(Varying):
    """PyramidKV's per-layer budgets, as kvpress computes them for the user's ratio.

    kvpress's ``PyramidKVPress(compression_ratio=1 - r)`` (``1 - B/n`` for a budget) is built
    as it is; its own ``get_layer_budget`` gives each layer's count, which add up to about
    ``layers x r n`` (not exactly: kvpress rounds each layer, and falls back to SnapKV's
    ``round(r n)`` in every layer where the pyramid does not fit).
    """

    own_scorer = kvpress.PyramidKVPress

    def is_noop(self, stage: Stage, n: int) -> bool:
        # one entry: kvpress's budget is 1 (it would assert on the window), nothing to evict
        return n == 1 or stage.ratio == 1.0 or (stage.budget is not None and stage.budget >= n)

    def expected_counts(self, stage: Stage, n: int, n_layers: int, config: Any) -> list[int]:
        press = stage.build(n)
        return [press.get_layer_budget(SimpleNamespace(layer_idx=i, config=config), n)
                for i in range(n_layers)]

    def compression_ratio(self, stage: Stage, n: int) -> float:
        if stage.budget is not None:
            return removed_fraction(Fraction(min(stage.budget, n), n))
        return removed_fraction(Fraction(repr(stage.ratio)))

    def table_row(self) -> tuple[str, str, str]:
        return f"{self.name}:ratio=R | budget=B", self.own_scorer.__name__, self.keeps


class PerLayer(Varying):
    """``floor(r_l n)`` entries in layer ``l``, every KV head (``ratios=r_0/r_1/...``)."""

    budgets = ("ratios",)

    def is_noop(self, stage: Stage, n: int) -> bool:
        return all(_exact_floor(r, n) >= n for r in stage.ratios or ())

    def expected_counts(self, stage: Stage, n: int, n_layers: int, config: Any) -> list[int]:
        stage.check_layers(n_layers)
        return [min(n, max(1, _exact_floor(r, n))) for r in stage.ratios]

    def build(self, stage: Stage, n: int) -> Any:
        ratios = [_ratio_for(r, min(n, max(1, _exact_floor(r, n))), n) for r in stage.ratios]
        return self.press(press=stage.clamped_scorer(n, 0.0), compression_ratios=ratios)

    def kvpress_call(self, stage: Stage) -> str:
        ratios = [removed_fraction(Fraction(repr(r))) for r in stage.ratios]
        return (f"{self.press_name}(press={scorer_call(stage, None)}, "
                f"compression_ratios={ratios})")


class Decoding(Family):
    """Prefill untouched; every ``interval`` generated tokens the cache is cut to ``target``
    entries (``DecodingPress``), or with ``ratio=`` to that fraction of the tokens seen so far
    (``CompressionRatioDecodingPress``); the rule itself is :mod:`kvdrift.lm.engine.decoding`."""

    budgets = ()
    uniform = False
    is_decoding = True
    also_presses = {"CompressionRatioDecodingPress": "decoding-<scorer>:interval=I,ratio=R"}
    reorders: ClassVar[bool] = True  # its compressions reorder and shorten the cache

    def kept(self, stage: Stage, n: int) -> int:
        return n  # at prefill

    def is_noop(self, stage: Stage, n: int) -> bool:
        return True

    def _press(self, stage: Stage) -> tuple[type, dict[str, Any]]:
        """The kvpress class and its fields other than ``base_press``."""
        kwargs = self.wrapper_kwargs(stage)
        if stage.ratio is None:
            return self.press, kwargs
        ratio = removed_fraction(Fraction(repr(stage.ratio)))
        return kvpress.CompressionRatioDecodingPress, {**kwargs, "target_compression_ratio": ratio}

    def base_press(self, stage: Stage) -> Any:
        """The press it compresses with (kvpress's ``base_press``): the scorer."""
        return stage.scorer_press()

    def base_call(self, stage: Stage) -> str:
        """:meth:`base_press` as the Python call that rebuilds it."""
        return scorer_call(stage, None)

    def build(self, stage: Stage, n: int) -> Any:
        cls, kwargs = self._press(stage)
        return cls(base_press=self.base_press(stage), **kwargs)

    def kvpress_call(self, stage: Stage) -> str:
        cls, kwargs = self._press(stage)
        wrapper = [f"{k}={v!r}" for k, v in kwargs.items()]
        return (f"{cls.__name__}("
                f"{', '.join([f'base_press={self.base_call(stage)}', *wrapper])})")

    def table_row(self) -> tuple[str, str, str]:
        return f"{self.name}-<scorer>:interval=I,target=T", self.press_name, self.keeps


class Cam(Decoding):
    """kvpress's ``CAMPress``: prefill untouched; after every ``interval`` generated tokens
    (once the cache holds more than ``target``) the cache is cut to ``target`` entries, evicted
    values merged into the next ``merge`` kept ones, each merge drawn from the row's own
    generator; the rule itself is :mod:`kvdrift.lm.engine.decoding_cam`."""

    also_presses: ClassVar[dict[str, str]] = {}

    def _press(self, stage: Stage) -> tuple[type, dict[str, Any]]:
        return self.press, self.wrapper_kwargs(stage)


class HeadAdaptiveDecoding(Decoding):
    """kvpress's ``DecodingPress`` (with ``ratio=``, ``CompressionRatioDecodingPress``) over an
    ``AdaKVPress`` over the scorer: it compresses on a ``DecodingPress``'s schedule but removes
    nothing, hiding all but ``target`` entries per KV head on average (each head at least its
    ``alpha_safeguard`` share), per KV head; ``adaptive`` maps the spec fields that go to the
    ``AdaKVPress``. The rule itself is :mod:`kvdrift.lm.engine.decoding_adakv`."""

    also_presses: ClassVar[dict[str, str]] = {}
    reorders: ClassVar[bool] = False  # it hides in place: it follows a head-adaptive prefill
    adaptive: ClassVar[tuple[tuple[str, str], ...]] = (("alpha_safeguard", "alpha_safeguard"),)

    @property
    def field_map(self) -> dict[str, str]:
        return {**dict(self.fields), **dict(self.adaptive)}

    def wrapper_defaults(self) -> dict[str, Any]:
        by_name = {f.name: f.default for f in dataclasses.fields(kvpress.AdaKVPress)}
        return {**super().wrapper_defaults(),
                **{spec: by_name.get(press) for spec, press in self.adaptive}}

    def wrapper_kwargs(self, stage: Stage) -> dict[str, Any]:
        """The decoding press's fields (the ``AdaKVPress``'s go to :meth:`adaptive_kwargs`)."""
        fields = dict(self.fields)
        return {fields[k]: v for k, v in stage.kwargs if k in fields}

    def adaptive_kwargs(self, stage: Stage) -> dict[str, Any]:
        """The ``AdaKVPress``'s fields given, by their kvpress names."""
        fields = dict(self.adaptive)
        return {fields[k]: v for k, v in stage.kwargs if k in fields}

    def base_press(self, stage: Stage) -> Any:
        return kvpress.AdaKVPress(press=stage.scorer_press(), **self.adaptive_kwargs(stage))

    def base_call(self, stage: Stage) -> str:
        fields = [f"{k}={v!r}" for k, v in self.adaptive_kwargs(stage).items()]
        return f"AdaKVPress({', '.join([f'press={scorer_call(stage, None)}', *fields])})"


# kvdrift's departures from the kvpress press (each family's ``departs``)
_EXACT = ("keeps floor(r n) (at least 1) where kvpress's float int(n (1 - c)) lands lower "
          "(r=0.1, n=20: 2, not 1); window_size and n_sink clamped to n - 1 where kvpress "
          "asserts on short prompts")

PLAIN = Plain("", None, "floor(r n) (or min(B, n)) entries in every layer and KV head",
              departs=_EXACT)

# The registry of families, by spec prefix: the action parser (lm/actions/spec.py) reads it.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    PLAIN,
    HeadAdaptive("adakv", kvpress.AdaKVPress,
                 "kv_heads x floor(r n) entries per layer, split across KV heads by score (each "
                 "head keeps at least alpha_safeguard of floor(r n))",
                 (("alpha_safeguard", "alpha_safeguard"),),
                 departs="hidden entries are masked exactly where kvpress writes fake keys "
                 "(equal up to float noise); " + _EXACT),
    HeadAdaptive("criticaladakv", kvpress.CriticalAdaKVPress,
                 "as adakv, with scores weighted by the output-projected value norm",
                 (("alpha_safeguard", "alpha_safeguard"), ("epsilon", "epsilon"),
                  ("first_stage_ratio", "first_stage_ratio")),
                 departs="as adakv"),
    Family("criticalkv", kvpress.CriticalKVPress,
           "floor(r n) in every layer and KV head, scores weighted by the output-projected value "
           "norm", (("epsilon", "epsilon"), ("first_stage_ratio", "first_stage_ratio")),
           departs=_EXACT),
    Family("block", kvpress.BlockPress,
           "floor(r n) in every layer and KV head, chosen block by block",
           (("block_size", "block_size"),), departs=_EXACT),
    Family("rerotate", kvpress.KeyRerotationPress,
           "floor(r n) in every layer and KV head; kept keys are re-rotated to positions "
           "0..kept-1", departs=_EXACT),
    Chunk("chunk", kvpress.ChunkPress,
          "floor(r len) (at least 1) of every chunk of chunk_length entries, in every layer and "
          "KV head", (("chunk_length", "chunk_length"),), departs=_EXACT + " (per chunk)"),
    ChunkKV("chunkkv", kvpress.ChunkKVPress,
            "floor(r c) (at least 1) whole chunks of the c chunks of chunk_length entries, the "
            "same in every layer and KV head (a prompt shorter than one chunk: floor(r n), as "
            "kvpress)", (("chunk_length", "chunk_length"),), departs=_EXACT + " (of chunks)"),
    PyramidKV("pyramidkv", None,
              "kvpress's PyramidKV layer budgets for compression_ratio 1 - r (more in lower "
              "layers; SnapKV's round(r n) in every layer where the pyramid does not fit); "
              "SnapKV scores",
              departs="a one-token prompt is left whole, and window_size is clamped to n - 1 "
              "where kvpress asserts on short prompts"),
    PerLayer("perlayer", kvpress.PerLayerCompressionPress,
             "floor(r_l n) entries in layer l, every KV head (ratios=r_0/r_1/... one per layer)",
             departs=_EXACT + " (per layer)"),
    Decoding("decoding", kvpress.DecodingPress,
             "prompt untouched at prefill; after every `interval` generated tokens the row's "
             "cache (prompt + generated) is cut to `target` entries per layer and KV head (with "
             "ratio=R: to max(1, int(seen (1 - c))) of the seen tokens, c = 1 - R: kvpress's "
             "CompressionRatioDecodingPress)",
             (("interval", "compression_interval"), ("target", "target_size"),
              ("buffer", "hidden_states_buffer_size"))),
    HeadAdaptiveDecoding(
        "decoding-adakv", kvpress.DecodingPress,
        "prompt untouched at prefill; after every `interval` generated tokens nothing is "
        "removed: AdaKV scores the row's whole cache (prompt + generated) and hides all but "
        "`target` entries per KV head on average, split across KV heads by score (each head "
        "keeps at least alpha_safeguard of `target`; ratio=R: kvpress's "
        "CompressionRatioDecodingPress's target)",
        (("interval", "compression_interval"), ("target", "target_size"),
         ("buffer", "hidden_states_buffer_size")),
        departs="hidden entries are masked exactly where kvpress writes fake keys (equal up "
        "to float noise)"),
    Cam("cam", kvpress.CAMPress,
        "prompt untouched at prefill; after every `interval` generated tokens, once a layer "
        "holds more than `target` entries, its cache is cut to `target` entries per layer and "
        "KV head, each evicted value merged into the next `merge` kept ones with a probability "
        "from the attention it received (kvpress's CAMPress; each row draws its merges from "
        "its own generator)",
        (("interval", "compression_interval"), ("target", "target_size"),
         ("buffer", "hidden_states_buffer_size"), ("merge", "merge_budget"))),
)}


def family_names() -> str:
    """The named families, comma-separated, for messages."""
    return ", ".join(f.name for f in FAMILIES.values() if f.name)


def scorer_classes() -> dict[str, type]:
    """Offered scorer class names -> classes (those present in the installed kvpress)."""
    names = sorted(set(SCORERS.values()))
    return {name: getattr(kvpress, name) for name in names if hasattr(kvpress, name)}


def scorer_fields(scorer: type) -> dict[str, dataclasses.Field]:
    """User-settable fields of a scorer class (``compression_ratio`` is set by the budget)."""
    return {f.name: f for f in dataclasses.fields(scorer)
            if f.init and not f.name.startswith("_") and f.name != "compression_ratio"}


def field_defaults(family: Family, scorer: type) -> dict[str, Any]:
    """Every field a stage of ``family`` with ``scorer`` takes -> its kvpress default (the
    wrapper's over the scorer's; ``dataclasses.MISSING`` where kvpress has none)."""
    return {**{k: f.default for k, f in scorer_fields(scorer).items()},
            **family.wrapper_defaults()}


def allowed_scorers() -> str:
    short = ", ".join(sorted(k for k, v in SCORERS.items() if v in scorer_classes()))
    return f"{short} (or a kvpress class name: {', '.join(scorer_classes())})"


def resolve_scorer(name: str) -> type:
    """Map a short scorer name or kvpress class name to the scorer class, or raise ValueError."""
    classes = scorer_classes()
    if name in classes:
        return classes[name]
    if not_a_spec(name):
        raise ValueError(not_a_spec(name))
    key = name.strip().lower().replace("-", "_")
    if key in SCORERS and SCORERS[key] in classes:
        return classes[SCORERS[key]]
    raise checks.refuse("press", f"one of {allowed_scorers()}, or <family>-<scorer> with "
                        f"family one of {family_names()}", name)


def user_ratio(stage: Stage) -> str:
    """kvpress's ``compression_ratio`` for the stage's budget, as text: ``1 - ratio`` (a
    budget B: ``1 - min(B, n) / n``, which depends on the prompt length n)."""
    if stage.budget is not None:
        return f"1 - min({stage.budget}, n) / n"
    return repr(removed_fraction(Fraction(repr(stage.ratio))))


def scorer_call(stage: Stage, compression_ratio: str | None) -> str:
    """``SnapKVPress(compression_ratio=0.5, window_size=32)``: the stage's scorer as Python."""
    fam = stage.family
    args = [] if compression_ratio is None else [f"compression_ratio={compression_ratio}"]
    args += [f"{k}={v!r}" for k, v in stage.kwargs if k not in fam.field_map]
    return f"{stage.scorer_name}({', '.join(args)})"


def _exact_floor(ratio: float, n: int) -> int:
    """floor(ratio * n) in exact decimal arithmetic (floor(0.9 * 10) must be 9)."""
    return math.floor(Fraction(repr(ratio)) * n)


def _ratio_or_budget(stage: Stage, n: int) -> int:
    """``min(B, n)`` for a budget, else ``floor(r n)`` (at least 1)."""
    if stage.budget is not None:
        return min(stage.budget, n)
    return min(n, max(1, _exact_floor(stage.ratio, n)))


def removed_fraction(kept: Fraction) -> float:
    """kvpress's ``compression_ratio`` (fraction removed) for a kept fraction, ``1 - kept``
    in exact decimal arithmetic (kept 0.7 -> 0.3, as a user writing the press would)."""
    return float(1 - kept)


def _kvpress_kept(n: int, compression_ratio: float) -> int:
    """Entries kvpress's scorers keep of ``n`` (``max(1, int(n (1 - c)))``)."""
    return max(1, int(n * (1 - compression_ratio)))


def _ratio_for(ratio: float, kept: int, n: int) -> float:
    """The user's ``1 - ratio`` where kvpress keeps ``kept`` of ``n`` under it; else
    :func:`mid_ratio` (kvdrift's exact floor where kvpress's float product lands one lower,
    e.g. ratio 0.1 at n = 20: kvpress keeps int(20 x 0.09999999999999998) = 1, kvdrift 2)."""
    user = removed_fraction(Fraction(repr(ratio)))
    return user if int(n * (1 - user)) == kept else mid_ratio(kept, n)


def press_ratio(stage: Stage, kept: int, n: int) -> float:
    """kvpress ``compression_ratio`` keeping ``kept`` of ``n`` for ``stage``'s budget (every
    scorer's ``int(n (1 - c))``, StreamingLLM's included, lands on ``kept``)."""
    if stage.ratio is None:
        return mid_ratio(kept, n)
    return _ratio_for(stage.ratio, kept, n)


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

    ``family`` is the :class:`Family` object (from :data:`FAMILIES`), ``scorer`` the kvpress
    scorer class; ``ratio`` is the fraction *kept* (``floor(ratio * n)``, at least 1),
    ``budget`` a fixed count (``min(budget, n)``), ``ratios`` per-layer fractions kept
    (``perlayer``) and ``kwargs`` the press fields as sorted ``(spec name, value)`` pairs
    (family fields by their spec names, e.g. ``interval``; the rest are the scorer's).
    """

    family: Family
    scorer: type
    ratio: float | None = None
    budget: int | None = None
    ratios: tuple[float, ...] | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        fam = self.family
        label = self.label
        given = [k for k, v in (("ratio", self.ratio), ("budget", self.budget),
                                ("ratios", self.ratios)) if v is not None]
        fam.check_budget(self, given)
        if self.ratio is not None:
            object.__setattr__(self, "ratio", checks.number(
                self.ratio, f"{label}: ratio (fraction of entries kept)", 0, 1, open_lo=True))
        if self.budget is not None:
            object.__setattr__(self, "budget", checks.integer(
                self.budget, f"{label}: budget (entries kept)", 1))
        if self.ratios is not None:
            checks.integer(len(self.ratios), f"{label}: number of ratios (one per layer)", 1)
            object.__setattr__(self, "ratios", tuple(
                checks.number(r, f"{label}: ratios[{i}] (fraction kept in layer {i})", 0, 1,
                              open_lo=True) for i, r in enumerate(self.ratios)))
        names = (*fam.field_map, *scorer_fields(self.scorer))
        for key, value in self.kwargs:
            check_field_name(label, key, fam.budgets, names)
            check_field(label, key, value)
        object.__setattr__(self, "kwargs", tuple(sorted(self.kwargs)))

    # --- what it keeps (the family decides) ---------------------------------------------
    @property
    def label(self) -> str:
        return self.family.label(self.scorer_name)

    @property
    def scorer_name(self) -> str:
        """The scorer's kvpress class name (as labels and messages show it)."""
        return self.scorer.__name__

    @property
    def is_decoding(self) -> bool:
        return self.family.is_decoding

    @property
    def head_adaptive(self) -> bool:
        return self.family.head_adaptive

    @property
    def needs_attention_weights(self) -> bool:
        return self.scorer in NEEDS_ATTENTION_WEIGHTS

    def field(self, name: str, default: Any = None) -> Any:
        """A spec field's value, or the kvpress default of the press it belongs to."""
        given = dict(self.kwargs)
        if name in given:
            return given[name]
        value = field_defaults(self.family, self.scorer).get(name, dataclasses.MISSING)
        return default if value is dataclasses.MISSING else value

    @property
    def uniform(self) -> bool:
        """Whether every layer and KV head keeps one count that depends only on n."""
        return self.family.uniform

    def kept(self, n: int) -> int:
        """Entries kept per KV head (on average over heads for head-adaptive presses)."""
        return self.family.kept(self, n)

    def chunks(self, n: int) -> list[int]:
        """Lengths of the chunks of ``chunk_length`` a prompt of ``n`` entries falls into."""
        size = int(self.field("chunk_length"))
        return [min(size, n - i) for i in range(0, n, size)]

    def is_noop(self, n: int) -> bool:
        """Whether nothing is evicted at prefill for a prompt of ``n`` entries."""
        return self.family.is_noop(self, n)

    def check_layers(self, n_layers: int) -> None:
        """Raise ValueError unless per-layer ``ratios`` (if any) give one value per layer of a
        model with ``n_layers`` layers: checked before a run writes anything."""
        if self.ratios is not None and len(self.ratios) != n_layers:
            raise ValueError(f"{self.label}: ratios has {len(self.ratios)} values; the model "
                             f"has {n_layers} layers (give one kept fraction per layer)")

    def expected_counts(self, n: int, n_layers: int, config: Any) -> list[int] | None:
        """Entries each KV head of each layer keeps after prefill (None: head-adaptive)."""
        return self.family.expected_counts(self, n, n_layers, config)

    def check_counts(self, n: int, counts: Any, config: Any) -> None:
        """Raise RuntimeError unless ``counts`` ``[layers, kv_heads]`` is what this promises."""
        self.family.check_counts(self, n, counts, config)

    # --- the kvpress press --------------------------------------------------------------
    def scorer_press(self, compression_ratio: float = 0.0) -> Any:
        """A fresh scorer press with this stage's scorer fields."""
        fam = self.family
        fields = scorer_fields(self.scorer)
        kwargs = {k: v for k, v in self.kwargs if k not in fam.field_map and k in fields}
        return self.scorer(compression_ratio=compression_ratio, **kwargs)

    def kvpress_call(self) -> str:
        """The kvpress press this stage is, as the Python call that rebuilds it."""
        return self.family.kvpress_call(self)

    def build(self, n: int) -> Any:
        """A fresh kvpress press for a prompt of ``n`` entries (fields that kvpress requires
        below the prompt length, such as SnapKV's ``window_size``, are clamped to ``n - 1``)."""
        with _quiet_kvpress():
            return self.family.build(self, n)

    def clamped_scorer(self, n: int, compression_ratio: float) -> Any:
        """A fresh scorer press for ``n`` entries, with ``window_size`` and ``n_sink`` clamped
        to ``n - 1`` (kvpress asserts on shorter inputs: this is kvdrift's documented fallback
        for short prompts)."""
        return clamp_to_length(self.scorer_press(compression_ratio), n)


def clamp_to_length(press: Any, n: int) -> Any:
    """``press`` with ``window_size`` and ``n_sink`` lowered to ``n - 1`` where they are not
    below ``n`` (kvpress asserts on shorter inputs: kvdrift's documented fallback)."""
    for key in ("window_size", "n_sink"):
        value = getattr(press, key, None)
        if isinstance(value, int) and value >= n:
            setattr(press, key, n - 1)
    return press


def family_table() -> list[tuple[str, str, str, str]]:
    """(spec form, kvpress press, what it keeps, where kvdrift departs) for every family."""
    return [(*fam.table_row(), fam.departs) for fam in FAMILIES.values()]
