"""Which decoding-time presses of kvpress kvdrift replays row by row, and why not the others.

A press object given as an action may compress during generation: a ``DecodingPress`` (or
``CompressionRatioDecodingPress``, whose target is a fraction of the tokens seen) over any
``ScorerPress``, alone or as ``PrefillDecodingPress``'s ``decoding_press``, becomes a
:class:`~kvdrift.lm.engine.decoding.DecodingRule`; over an ``AdaKVPress``, which hides entries
per KV head instead (the spec ``decoding-adakv-<scorer>``), a
:class:`~kvdrift.lm.engine.decoding_adakv.HeadAdaptiveRule`; a
``CAMPress`` a :class:`~kvdrift.lm.engine.decoding_cam.CamRule`; a ``DMSPress`` with
``decoding=True`` a
:class:`~kvdrift.lm.engine.decoding_threshold.ThresholdRule`. Each replays kvpress's
compressions on every row exactly. A press kvdrift does not replay is refused in one line
that says what the press itself does that stands in the way.
"""

from __future__ import annotations

from typing import Any

import kvpress

from kvdrift.lm.actions.attention_use import nested_presses
from kvdrift.lm.actions.identity import check_press
from kvdrift.lm.engine.decoding import DecodingRule
from kvdrift.lm.engine.decoding_adakv import HeadAdaptiveRule
from kvdrift.lm.engine.decoding_cam import CamRule
from kvdrift.lm.engine.decoding_threshold import ThresholdRule

# DecodingPress methods a replayed press must inherit unchanged (its target may follow
# CompressionRatioDecodingPress's rule: kvdrift asks the press for it at every compression).
_DECODING_METHODS = ("forward_hook", "compress", "_find_target_compression_ratio")
_TARGET_RULES = tuple({cls._resolve_target_size for cls in (
    kvpress.DecodingPress, kvpress.CompressionRatioDecodingPress)})

# Prefill presses that hide entries per KV head by their cache positions (kvpress's
# ``masked_key_indices``) instead of removing them.
_HIDES_BY_POSITION: tuple[type, ...] = (kvpress.AdaKVPress, kvpress.CriticalAdaKVPress,
                                         kvpress.DMSPress)

# CAMPress methods a replayed CAMPress must inherit unchanged.
_CAM_METHODS = ("forward_hook", "compress", "_compute_current_token_attention",
                "_aggregate_attention_per_kv_head", "_find_target_compression_ratio")


def decoding_rule(press: Any, name: str
                  ) -> DecodingRule | ThresholdRule | HeadAdaptiveRule | CamRule | None:
    """The decoding-time compression of ``press`` (None: it compresses at prefill only);
    one-line ValueError, in the press's own terms, for one kvdrift does not replay."""
    check_press(press, name)
    prefill = None
    decoding = press
    if isinstance(press, kvpress.PrefillDecodingPress):
        prefill, decoding = press.prefilling_press, press.decoding_press
    if decoding is None or not _decodes(decoding):
        return None
    refused = _field_refusal(decoding) or _refusal(decoding, prefill)
    if refused is not None:
        raise ValueError(f"action {name!r}: {refused}")
    if isinstance(decoding, kvpress.DMSPress):
        return ThresholdRule(decoding, name)
    if isinstance(decoding, kvpress.CAMPress):
        return CamRule(decoding, name)
    if isinstance(decoding.base_press, kvpress.AdaKVPress):
        return HeadAdaptiveRule(decoding, name)
    return DecodingRule(decoding, name)


def stage_rule(stage: Any) -> DecodingRule | HeadAdaptiveRule | CamRule:
    """The rule of a spec's decoding stage (``decoding-<scorer>``, ``decoding-adakv-<scorer>``
    or ``cam-<scorer>``): the rule its press would get as a press object."""
    press = stage.build(1)
    if isinstance(press, kvpress.CAMPress):
        return CamRule(press, stage.label, spec=True)
    if isinstance(press.base_press, kvpress.AdaKVPress):
        return HeadAdaptiveRule(press, stage.label, spec=True)
    return DecodingRule.of_stage(stage)


#: A decoding press's integer fields and the least value kvpress's arithmetic needs.
_INTEGER_FIELDS = {"compression_interval": 1, "target_size": 1, "hidden_states_buffer_size": 0,
                   "merge_budget": 0}


def _field_refusal(decoding: Any) -> str | None:
    """A decoding press's field set out of range after construction (kvpress checks them in
    ``__post_init__`` only): ``compression_interval = 0`` divides by zero at the first step, a
    negative buffer or a target below 1 fail or keep nothing (issue N4)."""
    cls = type(decoding).__name__
    for name, least in _INTEGER_FIELDS.items():
        if not hasattr(decoding, name):
            continue
        value = getattr(decoding, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return f"its {cls}.{name} must be an integer >= {least}; got {value!r}"
    ratio = getattr(decoding, "target_compression_ratio", None)
    if ratio is not None and not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool)
                                  and 0 <= ratio < 1):
        return (f"its {cls}.target_compression_ratio (the fraction removed) must be a number in "
                f"[0, 1); got {ratio!r}")
    return None


def _refusal(decoding: Any, prefill: Any) -> str | None:
    """Why kvdrift does not replay ``decoding`` (after ``prefill``), or None."""
    cls = type(decoding).__name__
    if isinstance(decoding, kvpress.CAMPress):
        return _cam_refusal(decoding, prefill)
    if isinstance(decoding, kvpress.DMSPress):
        if prefill is not None:
            return ("its decoding_press DMSPress scores the prompt at prefill itself (kvpress "
                    "fails at the first decoding step without those scores); give the DMSPress "
                    "alone, it compresses at prefill and during decoding")
        return None
    overridden = [m for m in _DECODING_METHODS
                  if getattr(type(decoding), m) is not getattr(kvpress.DecodingPress, m)]
    if type(decoding)._resolve_target_size not in _TARGET_RULES:
        overridden.append("_resolve_target_size")
    if overridden:
        return (f"{cls} overrides DecodingPress's {', '.join(overridden)}, so it compresses "
                f"during decoding in its own way, which kvdrift cannot replay; subclass "
                f"DecodingPress (or CompressionRatioDecodingPress) without overriding them")
    if not isinstance(decoding.base_press, (kvpress.ScorerPress, kvpress.AdaKVPress)):
        return (f"its {cls} scores with a {type(decoding.base_press).__qualname__}; kvpress's "
                f"DecodingPress takes a ScorerPress or an AdaKVPress as base_press")
    if isinstance(decoding.base_press, kvpress.AdaKVPress):
        return None  # it hides per head too, in the cache's own order, which never changes
    hider = next((p for p in nested_presses(prefill) if isinstance(p, _HIDES_BY_POSITION)), None)
    if hider is not None:
        return (f"its prefilling_press {type(hider).__name__} hides entries per KV head by "
                f"their positions in the cache, and its {cls}'s first compression reorders and "
                f"shortens that cache, so kvpress then hides positions that hold other entries "
                f"or no longer exist (or fails with IndexError); use a prefill press that "
                f"evicts, a {cls} over an AdaKVPress, or the {cls} alone")
    return None


def _cam_refusal(cam: Any, prefill: Any) -> str | None:
    """Why kvdrift does not replay the CAMPress ``cam`` (after ``prefill``), or None."""
    cls = type(cam).__name__
    overridden = [m for m in _CAM_METHODS
                  if getattr(type(cam), m) is not getattr(kvpress.CAMPress, m)]
    if overridden:
        return (f"{cls} overrides CAMPress's {', '.join(overridden)}, so it compresses during "
                f"decoding in its own way, which kvdrift cannot replay; subclass CAMPress "
                f"without overriding them")
    if not isinstance(cam.base_press, kvpress.ScorerPress):
        return (f"its {cls} scores with {type(cam.base_press).__name__}, but CAMPress calls "
                f"its base_press's score, which only a ScorerPress has; give base_press a "
                f"ScorerPress")
    hider = next((p for p in nested_presses(prefill) if isinstance(p, _HIDES_BY_POSITION)), None)
    if hider is not None:
        return (f"its prefilling_press {type(hider).__name__} hides entries per KV head, and "
                f"its {cls} keeps and merges the same entries in every KV head; use a prefill "
                f"press that evicts, or the {cls} alone")
    return None


def _decodes(press: Any) -> bool:
    """Whether a press acts on the cache during generation (kvpress's decoding presses, and
    DMSPress with decoding=True)."""
    if isinstance(press, (kvpress.DecodingPress, kvpress.PrefillDecodingPress)):
        return True
    return isinstance(press, kvpress.DMSPress) and bool(press.decoding)


__all__ = ["decoding_rule", "stage_rule"]
