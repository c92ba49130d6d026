"""The rules a press imposes on its own settings, checked before a run writes anything.

kvpress checks a ``DecodingPress`` only when it compresses: its scorer asserts deep inside
generation (SnapKV's ``window_size`` above the hidden states a compression holds, a scorer
that reads attention weights decoding steps never return, one that scores only a prefill),
and a press that never compresses within the horizon measures nothing. :func:`problems`
names each such rule that cannot hold, in the press's own fields (a spec's ``interval=`` or
a press object's ``compression_interval=``) with the fix, so a command refuses it at once.
:func:`prompt_problem` does the same for a press object's prefill against the shortest
prompt (SnapKV asserts its window is below the prompt; a named spec clamps it instead).
"""

from __future__ import annotations

from typing import Any

import kvpress

from kvdrift.lm.actions.presses import wrapper_problem

# Scorers that read the layer's attention weights, which kvpress's decoding hook never has
# (it passes the attention output's weights, None under SDPA, and the prefill's eager
# attention does not apply to decoding steps).
NEEDS_ATTENTION: tuple[type, ...] = (kvpress.ObservedAttentionPress,)

# Scorers whose queries must be the scored keys' own tokens (kvpress asserts "only supports
# prefill"): a decoding compression scores the whole cache from the last steps' inputs.
PREFILL_ONLY: tuple[type, ...] = tuple(
    getattr(kvpress, name) for name in ("LeverageScorePress", "NonCausalAttnPress",
                                        "CompactorPress") if hasattr(kvpress, name))


def scorer_problem(scorer: object, who: str) -> str | None:
    """Why ``scorer`` cannot score a decoding-time compression (``who`` names the press that
    uses it), or None."""
    name = type(scorer).__name__
    if isinstance(scorer, NEEDS_ATTENTION):
        return (f"{who} scores with {name}, which reads attention weights that kvpress's "
                f"decoding steps do not return; score with another scorer (e.g. KnormPress)")
    if isinstance(scorer, PREFILL_ONLY):
        return (f"{who} scores with {name}, which scores only a prefill (kvpress asserts its "
                f"queries are the scored tokens themselves); score with another scorer (e.g. "
                f"KnormPress)")
    return None


def problems(rule: Any, horizon: int | None = None) -> list[str]:  # a decoding.DecodingRule
    """Each rule of ``rule``'s press that cannot hold (one line each, with the fix); with
    ``horizon``, also a press that cannot compress within ``horizon`` generated positions."""
    spec = rule.spec
    interval = "interval=" if spec else "compression_interval="
    buffer = "buffer=" if spec else "hidden_states_buffer_size="
    who = f"its {type(rule.press).__name__}"
    found = []
    scorer = scorer_problem(rule.press.base_press, who)
    if scorer is not None:
        found.append(scorer)
    window_size = getattr(rule.press.base_press, "window_size", None)
    if isinstance(window_size, int) and rule.window <= window_size:
        raise_ = [f"{interval} to at least {window_size + 1}"] \
            if rule.interval <= window_size else []
        raise_ += [f"{buffer} to at least {window_size}"] if rule.buffer < window_size else []
        found.append(
            f"{who} compresses every {rule.interval} generated tokens from the hidden states "
            f"of the last min({interval.rstrip('=')}, {buffer.rstrip('=')} + 1) = {rule.window} "
            f"steps, but its {rule.scorer_name} looks at the last window_size={window_size}; "
            f"raise {' and '.join(raise_)}, or lower window_size= below {rule.window}")
    if horizon is not None and rule.every_step == 0 and rule.interval > horizon:
        found.append(
            f"{who} compresses first after {interval}{rule.interval} generated tokens, beyond "
            f"the horizon H = {horizon}, so Q would never be compressed; lower {interval} to at "
            f"most {horizon} or raise the horizon")
    return found


# Prefill fields kvpress asserts are below the prompt's length: (press class, field, what it is).
_BELOW_PROMPT: tuple[tuple[type, str, str], ...] = (
    (kvpress.SnapKVPress, "window_size", "scores the prompt from its last {} tokens"),
    (kvpress.ExpectedAttentionPress, "n_sink", "keeps {} first tokens"),
)


def prompt_problem(presses: list[object], document: str, n_prompt: int) -> str | None:
    """Why the prefill of ``presses`` (a press object and the presses inside it, its
    decoding-time scorer left out) cannot run on ``document``'s ``n_prompt`` tokens, or None."""
    for press in presses:
        for cls, field, what in _BELOW_PROMPT:
            value = getattr(press, field, None)
            if isinstance(press, cls) and isinstance(value, int) and value >= n_prompt:
                return (f"its {type(press).__name__} {what.format(f'{field}={value}')}, but "
                        f"document {document!r} has {n_prompt} prompt tokens (kvpress asserts "
                        f"more than {field}); lower {field}= below {n_prompt}")
    return None


def wrapped_problem(presses: list[object]) -> str | None:
    """Why a wrapper among ``presses`` cannot run the scorer it wraps (kvpress asserts), or
    None: :func:`~kvdrift.lm.actions.presses.wrapper_problem` for each wrapper's ``press``."""
    for press in presses:
        inner = getattr(press, "press", None)
        if isinstance(inner, kvpress.BasePress):
            found = wrapper_problem(type(press), type(inner))
            if found:
                return f"its {type(press).__name__}: {found}"
    return None


__all__ = ["NEEDS_ATTENTION", "PREFILL_ONLY", "problems", "prompt_problem", "scorer_problem",
           "wrapped_problem"]
