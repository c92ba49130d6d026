"""The names an action spec may use, known without importing kvpress, torch or transformers.

A command refuses a misspelt action or frontier family in a fraction of a second, before the
press library loads (which takes seconds): :func:`check_action_names` reads only the names
below. They are a static copy of what :mod:`kvdrift.lm.actions.spec` and
:mod:`kvdrift.lm.actions.presses` build from the installed kvpress; a test compares the two, so
the copy cannot drift. Only the names are checked here; everything else about a spec (its
fields, budget and values) is checked by :func:`kvdrift.lm.actions.spec.parse_action` once
kvpress is loaded, and any kvpress press class name is left to it (it says why one is not offered).
"""

from __future__ import annotations

from collections.abc import Collection

from kvdrift import checks
from kvdrift.lm.grammar.model_spec import parse_model_action

#: The named actions (:data:`kvdrift.lm.actions.spec.NAMED_ACTIONS`).
NAMED_ACTIONS = ("full", "snapkv-half", "snapkv-90", "snapkv-512", "recent-half", "recent-90")
#: Offered scorer presses by kvpress class name (:func:`kvdrift.lm.actions.presses.scorer_classes`).
SCORER_CLASSES = ("CURPress", "CapPress", "ExpectedAttentionPress", "KeyDiffPress",
                  "KnormPress", "LagKVPress", "LeverageScorePress", "NonCausalAttnPress",
                  "ObservedAttentionPress", "RandomPress", "SnapKVPress", "StreamingLLMPress",
                  "TOVAPress")
#: Their short names (:data:`kvdrift.lm.actions.presses.SCORERS`, those offered), sorted.
SCORER_NAMES = ("cap", "cur", "expected_attention", "keydiff", "knorm", "lagkv", "leverage",
                "non_causal_attn", "observed_attention", "random", "recent", "snapkv",
                "streaming_llm", "tova")
#: The families in registry order (:data:`kvdrift.lm.actions.presses.FAMILIES`); those written as
#: ``<family>-<scorer>``, and those that are one press named alone (by name or class name).
FAMILY_NAMES = ("adakv", "criticaladakv", "criticalkv", "block", "rerotate", "chunk", "chunkkv",
                "pyramidkv", "perlayer", "decoding", "decoding-adakv", "cam")
PREFIX_FAMILIES = ("adakv", "criticaladakv", "criticalkv", "block", "rerotate", "chunk",
                   "chunkkv", "perlayer", "decoding", "decoding-adakv", "cam")
OWN_SCORER_FAMILIES = {"pyramidkv": "PyramidKVPress"}
#: Every press class the installed kvpress exports; such a name is left to the full parser.
KVPRESS_PRESSES = (
    "AdaKVPress", "BasePress", "BlockPress", "CAMPress", "CURPress", "CapPress", "ChunkKVPress",
    "ChunkPress", "CompactorPress", "ComposedPress", "CompressionRatioDecodingPress",
    "CriticalAdaKVPress", "CriticalKVPress", "DMSPress", "DecodingPress", "DuoAttentionPress",
    "EntropyGatedChunkKVPress", "ExpectedAttentionPress", "ExpectedAttentionStatsPress",
    "FastKVzipPress", "FinchPress", "KVComposePress", "KVgradPress", "KVzapPress", "KVzipPress",
    "KeyDiffPress", "KeyRerotationPress", "KnormPress", "LUKVPress", "LagKVPress",
    "LeverageScorePress", "MergingPress", "NonCausalAttnPress", "ObservedAttentionPress",
    "PerLayerCompressionPress", "PrefillDecodingPress", "PyramidKVPress", "QFilterPress",
    "RandomPress", "RestoreKVPress", "ScorerPress", "SimLayerKVPress", "SnapKVPress",
    "StreamingLLMPress", "TOVAPress", "ThinKPress")
#: Quantization kinds (:data:`kvdrift.lm.quantized.transform.QUANTIZATIONS`): ``kivi:``, ...
QUANTIZATIONS = ("kivi", "gguf", "fp8")


def allowed_scorers() -> str:
    """The scorers a message lists (as :func:`kvdrift.lm.actions.presses.allowed_scorers`)."""
    return f"{', '.join(SCORER_NAMES)} (or a kvpress class name: {', '.join(SCORER_CLASSES)})"


def action_rule() -> str:
    """What an action may be, as the refusal of an unknown one states it."""
    return (f"one of {', '.join(NAMED_ACTIONS)}, or [<family>-]<scorer>:ratio=R (fraction "
            f"kept) / :budget=B (entries kept) with scorer one of {allowed_scorers()} and "
            f"family one of {', '.join(FAMILY_NAMES)} (see `kvdrift run --actions help`)")


def split_prefix(head: str) -> tuple[str, str]:
    """``[<family>-]<scorer>`` -> (the family prefix, lower case, or ``""``; the scorer), the
    longest family that prefixes it winning (``decoding-adakv-knorm`` is ``decoding-adakv``'s
    KnormPress, not ``decoding``'s ``adakv-knorm``)."""
    text = head.strip()
    for family in sorted(PREFIX_FAMILIES, key=len, reverse=True):
        if text.lower().startswith(f"{family}-"):
            return family, text[len(family) + 1:]
    return "", text


def _check_scorer(name: str) -> None:
    if name in KVPRESS_PRESSES or name.strip().lower().replace("-", "_") in SCORER_NAMES:
        return
    raise checks.refuse("press", f"one of {allowed_scorers()}, or <family>-<scorer> with "
                        f"family one of {', '.join(FAMILY_NAMES)}", name)


def _check_part(part: str) -> None:
    head, colon, _ = part.partition(":")
    if head.strip().lower() in QUANTIZATIONS:
        return
    if not colon:
        raise checks.refuse("action", action_rule(), part)
    text = head.strip()
    if text.lower() in OWN_SCORER_FAMILIES or text in OWN_SCORER_FAMILIES.values():
        return
    prefix, rest = split_prefix(text)
    if prefix:
        _check_scorer(rest)
    elif text not in KVPRESS_PRESSES:
        _check_scorer(text)


def press_chain(spec: object, defined: Collection[str]) -> str | None:
    """The press name of ``<press>+<quantization>`` where the press is one of ``defined`` (a
    press object of the user's own, chained with one of kvdrift's quantizers, e.g.
    ``mine-half+kivi:bits=4``), else None."""
    if not isinstance(spec, str):
        return None
    head, plus, tail = spec.strip().rpartition("+")
    if plus and head.strip() in defined and \
            tail.partition(":")[0].strip().lower() in QUANTIZATIONS:
        return head.strip()
    return None


def check_action_names(spec: object, defined: Collection[str] = ()) -> None:
    """ValueError (the message :func:`kvdrift.lm.actions.spec.parse_action` gives) if ``spec``
    names a press, scorer or family that no action has; silent otherwise, whatever else is
    wrong with it (the full parser sees that). ``defined``: names the user's own presses
    define (a ``--presses`` file), left to the parser once that file is loaded."""
    if not isinstance(spec, str) or not spec.strip() or spec.strip() in NAMED_ACTIONS:
        return
    head, model = parse_model_action(spec)
    if model is not None:  # <action>@<model>: Q's model, then its cache action
        check_action_names(head, defined)
        return
    if spec.strip() in defined or press_chain(spec, defined) is not None:
        return
    for part in spec.strip().split("+"):
        _check_part(part.strip())
