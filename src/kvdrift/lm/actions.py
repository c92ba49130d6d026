"""Actions: a kvpress press plus a budget rule, named by a short spec string.

An action says how many prompt entries survive eviction (per layer and KV head) and which
kvpress press chooses them. kvpress expresses budgets as ``compression_ratio`` (the fraction
*removed*, rounded by ``int(k_len * (1 - compression_ratio))``); kvdrift adds exact budgets on
top: an action's ``ratio`` is the fraction *kept* (``kept = floor(ratio * n)``) and ``budget``
a fixed count (``kept = min(budget, n)``). :meth:`Action.make_press` picks the compression
ratio in the middle of the rounding interval so that kvpress keeps exactly ``kept(n)``.

Named actions (SPEC.md section 8)::

    full          no eviction (same-path control)
    snapkv-half   SnapKV (window 64, kernel 5) keeping floor(n/2)
    snapkv-90     SnapKV keeping floor(9n/10)
    snapkv-512    SnapKV keeping min(512, n)
    recent-half   StreamingLLM (4 sinks + most recent) keeping floor(n/2)
    recent-90     StreamingLLM keeping floor(9n/10)

General form: ``<press>:ratio=R`` or ``<press>:budget=B``, optionally followed by press
fields, e.g. ``knorm:ratio=0.5``, ``snapkv:budget=256,window_size=32``. ``<press>`` is a
short name (see :data:`PRESS_NAMES`) or the exact kvpress class name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import kvpress

# Short names of kvpress score-based presses that keep the same number of entries in every
# layer and KV head, need no hub download, and run on prompts of any length >= 2.
PRESS_NAMES: dict[str, str] = {
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

# Presses that score from the attention weights returned by the layer: eager attention only.
NEEDS_ATTENTION_WEIGHTS = frozenset({"ObservedAttentionPress"})

# Press fields that must stay below the prompt length (kvpress asserts k_len > field).
_SHORT_PROMPT_FIELDS = ("window_size", "n_sink")


@dataclass(frozen=True)
class _Named:
    press: str | None
    ratio: float | None = None
    budget: int | None = None


NAMED_ACTIONS: dict[str, _Named] = {
    "full": _Named(press=None),
    "snapkv-half": _Named("SnapKVPress", ratio=0.5),
    "snapkv-90": _Named("SnapKVPress", ratio=0.9),
    "snapkv-512": _Named("SnapKVPress", budget=512),
    "recent-half": _Named("StreamingLLMPress", ratio=0.5),
    "recent-90": _Named("StreamingLLMPress", ratio=0.9),
}


def press_classes() -> dict[str, type]:
    """Supported kvpress class names -> classes (those present in the installed kvpress)."""
    names = sorted(set(PRESS_NAMES.values()))
    return {name: getattr(kvpress, name) for name in names if hasattr(kvpress, name)}


def press_fields(press: str) -> dict[str, dataclasses.Field]:
    """User-settable fields of a press class (``compression_ratio`` is set by the budget)."""
    cls = press_classes()[press]
    return {
        f.name: f
        for f in dataclasses.fields(cls)
        if f.init and not f.name.startswith("_") and f.name != "compression_ratio"
    }


def _allowed_presses() -> str:
    short = ", ".join(sorted(k for k, v in PRESS_NAMES.items() if v in press_classes()))
    return f"{short} (or a kvpress class name: {', '.join(press_classes())})"


def resolve_press(name: str) -> str:
    """Map a short press name or kvpress class name to the class name, or raise ValueError."""
    classes = press_classes()
    if name in classes:
        return name
    key = name.strip().lower().replace("-", "_")
    if key in PRESS_NAMES and PRESS_NAMES[key] in classes:
        return PRESS_NAMES[key]
    raise ValueError(f"unknown press {name!r}; allowed: {_allowed_presses()}")


@dataclass(frozen=True)
class Action:
    """An eviction policy: a kvpress press and a budget rule (``ratio`` kept or fixed ``budget``).

    ``press`` is a kvpress class name, or ``None`` for the ``full`` (no-eviction) action.
    Exactly one of ``ratio`` (fraction of prompt entries kept, in (0, 1]) and ``budget``
    (entries kept, >= 1) is set for a press. ``kwargs`` are extra press fields as sorted
    ``(name, value)`` pairs.
    """

    name: str
    press: str | None = None
    ratio: float | None = None
    budget: int | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.press is None:
            if self.ratio is not None or self.budget is not None or self.kwargs:
                raise ValueError(f"action {self.name!r}: the no-eviction action takes no ratio, "
                                 f"budget or kwargs")
            return
        resolved = resolve_press(self.press)
        if resolved != self.press:
            object.__setattr__(self, "press", resolved)
        if (self.ratio is None) == (self.budget is None):
            raise ValueError(f"action {self.name!r}: give exactly one of ratio=R (fraction kept, "
                             f"in (0, 1]) or budget=B (entries kept, >= 1)")
        if self.ratio is not None:
            ratio = float(self.ratio)
            if not (0.0 < ratio <= 1.0):
                raise ValueError(f"action {self.name!r}: ratio (fraction of prompt entries kept) "
                                 f"must be in (0, 1]; got {self.ratio}")
            object.__setattr__(self, "ratio", ratio)
        if self.budget is not None:
            if isinstance(self.budget, bool) or int(self.budget) != self.budget or self.budget < 1:
                raise ValueError(f"action {self.name!r}: budget (prompt entries kept) must be an "
                                 f"integer >= 1; got {self.budget}")
            object.__setattr__(self, "budget", int(self.budget))
        fields = press_fields(self.press)
        for key, _ in self.kwargs:
            if key not in fields:
                allowed = ", ".join(fields) or "none"
                raise ValueError(f"action {self.name!r}: unknown {self.press} field {key!r}; "
                                 f"allowed: {allowed} (plus ratio= or budget=)")
        object.__setattr__(self, "kwargs", tuple(sorted(self.kwargs)))

    def __str__(self) -> str:
        return self.name

    @property
    def needs_attention_weights(self) -> bool:
        """Whether the press scores from attention weights (needs eager attention in prefill)."""
        return self.press in NEEDS_ATTENTION_WEIGHTS

    def kept(self, n_prompt: int) -> int:
        """Prompt entries kept per layer and KV head for a prompt of ``n_prompt`` tokens (>= 1)."""
        if int(n_prompt) != n_prompt or n_prompt < 1:
            raise ValueError(f"prompt length must be an integer >= 1; got {n_prompt}")
        n = int(n_prompt)
        if self.press is None:
            return n
        if self.budget is not None:
            return min(self.budget, n)
        # exact decimal arithmetic: floor(0.9 * n) must be floor(9n/10) for every n
        keep = math.floor(Fraction(repr(self.ratio)) * n)
        return min(n, max(1, keep))

    def is_noop(self, n_prompt: int) -> bool:
        """Whether nothing is evicted for this prompt length (then the press is never run)."""
        return self.kept(n_prompt) >= n_prompt

    def compression_ratio(self, n_prompt: int) -> float:
        """kvpress ``compression_ratio`` under which its rounding keeps exactly ``kept(n_prompt)``.

        kvpress keeps ``max(1, int(k_len * (1 - r)))``; ``r = 1 - (kept + 1/2) / n`` lands
        ``k_len * (1 - r)`` mid-way between ``kept`` and ``kept + 1``, safe from float error.
        """
        kept = self.kept(n_prompt)
        if kept >= n_prompt:
            return 0.0
        return 1.0 - (kept + 0.5) / n_prompt

    def make_press(self, n_prompt: int) -> Any | None:
        """A fresh kvpress press for a prompt of ``n_prompt`` tokens, or ``None`` if a no-op.

        Fields that kvpress requires to be below the prompt length (SnapKV's ``window_size``,
        sinks ``n_sink``) are clamped to ``n_prompt - 1`` for short prompts.
        """
        if self.press is None or self.is_noop(n_prompt):
            return None
        cls = press_classes()[self.press]
        fields = press_fields(self.press)
        kwargs = dict(self.kwargs)
        for key in _SHORT_PROMPT_FIELDS:
            if key in fields:
                value = kwargs.get(key, fields[key].default)
                if isinstance(value, int) and value >= n_prompt:
                    kwargs[key] = n_prompt - 1
        return cls(compression_ratio=self.compression_ratio(n_prompt), **kwargs)


def _coerce(press: str, key: str, text: str) -> Any:
    """Parse a press field value from text, guided by the field's default."""
    fields = press_fields(press)
    default = fields[key].default if key in fields else None
    low = text.strip().lower()
    if isinstance(default, bool):
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ValueError(f"{press} field {key!r} must be true or false; got {text!r}")
    if low == "none":
        return None
    for parse in (int, float):
        try:
            value = parse(text)
        except ValueError:
            continue
        if isinstance(default, float):
            return float(value)
        return value
    if isinstance(default, (int, float)):
        raise ValueError(f"{press} field {key!r} must be a number; got {text!r}")
    return text.strip()


def _named_list() -> str:
    return ", ".join(NAMED_ACTIONS)


def parse_action(spec: str | Action) -> Action:
    """Parse an action spec: a named action or ``<press>:ratio=R|budget=B[,field=value...]``."""
    if isinstance(spec, Action):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty action spec; named actions: {_named_list()}; "
                         f"or <press>:ratio=R / <press>:budget=B")
    text = spec.strip()
    if text in NAMED_ACTIONS:
        named = NAMED_ACTIONS[text]
        return Action(name=text, press=named.press, ratio=named.ratio, budget=named.budget)
    if ":" not in text:
        raise ValueError(
            f"unknown action {text!r}; named actions: {_named_list()}; or <press>:ratio=R "
            f"(fraction kept) / <press>:budget=B (entries kept) with press one of "
            f"{_allowed_presses()}"
        )
    head, _, tail = text.partition(":")
    press = resolve_press(head)
    ratio: float | None = None
    budget: int | None = None
    kwargs: list[tuple[str, Any]] = []
    for item in filter(None, (part.strip() for part in tail.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise ValueError(f"action {text!r}: expected key=value, got {item!r}")
        if key == "ratio":
            try:
                ratio = float(value)
            except ValueError as exc:
                raise ValueError(f"action {text!r}: ratio must be a number in (0, 1]; "
                                 f"got {value!r}") from exc
        elif key == "budget":
            try:
                budget = int(value)
            except ValueError as exc:
                raise ValueError(f"action {text!r}: budget must be an integer >= 1; "
                                 f"got {value!r}") from exc
        elif key == "compression_ratio":
            raise ValueError(f"action {text!r}: use ratio= (fraction kept) or budget= "
                             f"(entries kept), not compression_ratio")
        else:
            if key not in press_fields(press):
                allowed = ", ".join(press_fields(press)) or "none"
                raise ValueError(f"action {text!r}: unknown {press} field {key!r}; allowed: "
                                 f"ratio, budget, {allowed}")
            kwargs.append((key, _coerce(press, key, value)))
    return Action(name=text, press=press, ratio=ratio, budget=budget, kwargs=tuple(kwargs))
