"""The model as it was: what a press may change besides its weights, checked and put back.

A press runs inside the model (kvpress: hooks on the attention layers, removed when its
context exits). One that edits the model's config (``rope_parameters``,
``num_key_value_heads``, the attention implementation), a buffer (the rotary ``inv_freq``), a
module's settings (the rotary ``attention_scaling``, ``training``), replaces a module's
``forward`` or leaves a hook behind would change every later unit and the model a Python caller
gets back, while the records name the model that was loaded (the weights are checked apart,
by their digest: :meth:`kvdrift.lm.factory.LMPairFactory.check_unit`).

:meth:`ModelState.of` is taken before a press runs; after it, :meth:`ModelState.changes` names
what differs and :meth:`ModelState.restore` puts the model back, so the unit can be refused in
one line (:func:`refusal`) and the next unit, or the caller, has the model that was named.
Cheap: configs are small dicts, buffers (rotary frequencies, masks) small tensors, cloned once.

Not checked: what a model updates itself as it runs (a dynamic or longrope rotary embedding
recomputes its frequencies for long sequences), the hidden entries kvpress's attention patch
reads (``masked_key_indices``: kvdrift clears them), attributes a press adds without replacing
one (kvpress gives each attention module the rotary embedding), submodules, patches of
modelling functions outside the model.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.modules.module as torch_module

#: A module's hook dicts, by the words a refusal names them with; the ``None`` ones are
#: torch's bookkeeping beside them (restored, not named).
HOOKS = {"_forward_hooks": "forward hook", "_forward_pre_hooks": "forward pre-hook",
         "_backward_hooks": "backward hook", "_backward_pre_hooks": "backward pre-hook",
         "_forward_hooks_with_kwargs": None, "_forward_hooks_always_called": None,
         "_forward_pre_hooks_with_kwargs": None}
#: torch's hooks on every module, in ``torch.nn.modules.module``.
GLOBAL_HOOKS = {"_global_forward_hooks": "global forward hook",
                "_global_forward_pre_hooks": "global forward pre-hook",
                "_global_backward_hooks": "global backward hook",
                "_global_backward_pre_hooks": "global backward pre-hook",
                "_global_forward_hooks_with_kwargs": None,
                "_global_forward_hooks_always_called": None}
#: Module attributes a forward legitimately leaves (kvpress's per-head mask: kvdrift clears it).
PER_FORWARD = frozenset({"masked_key_indices"})
#: The config entry that holds the attention implementation (named apart in a refusal).
ATTENTION = "_attn_implementation_internal"
#: What a refusal names, in this order.
KINDS = ("attention implementation", "config", "module settings", "buffers", "forward methods",
         "hooks")
#: Most changes a refusal spells out.
SHOWN = 3


@dataclass(frozen=True)
class Change:
    """One thing a press changed: its ``kind`` (one of :data:`KINDS`) and what, in words."""

    kind: str
    what: str


@dataclass(frozen=True, eq=False)
class _Config:
    prefix: str  # "" for the model's config, else e.g. "text_config."
    config: Any
    values: dict[str, Any]  # a deep copy of its attributes (nested configs: themselves)
    originals: dict[str, Any]  # the attributes themselves (put back, their contents restored)


@dataclass(frozen=True, eq=False)
class _Module:
    name: str
    module: Any
    settings: dict[str, Any]  # plain values (copied) and callables (themselves)
    originals: dict[str, Any]  # the settings' objects themselves
    buffers: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]  # (tensor, its clone)
    transient: frozenset[str]  # its non-persistent buffers
    hooks: dict[str, dict]
    forward: Any  # the instance's own ``forward``, or None


@dataclass(frozen=True, eq=False)
class ModelState:
    """A model's config, module settings, buffers, forwards and hooks at one moment."""

    configs: tuple[_Config, ...]
    modules: tuple[_Module, ...]
    global_hooks: dict[str, dict]

    @classmethod
    def of(cls, model: Any) -> ModelState:
        """The state of ``model`` now (module docstring)."""
        modules, configs = [], _configs(model)
        for name, module in _named_modules(model):
            moving = _self_updating(module)
            buffers = {} if moving else {
                key: (t, None if t is None else t.detach().clone())
                for key, t in module._buffers.items()}  # noqa: SLF001 - torch's registry
            hooks = {key: dict(getattr(module, key)) for key in HOOKS if hasattr(module, key)}
            modules.append(_Module(
                name, module, {} if moving else _settings(module),
                {} if moving else dict(vars(module)), buffers,
                frozenset(module._non_persistent_buffers_set),  # noqa: SLF001
                hooks, vars(module).get("forward")))
        global_hooks = {key: dict(getattr(torch_module, key)) for key in GLOBAL_HOOKS
                        if hasattr(torch_module, key)}
        return cls(tuple(configs), tuple(modules), global_hooks)

    def changes(self) -> tuple[Change, ...]:
        """What differs from this state now, in the order of :data:`KINDS`."""
        found: list[Change] = []
        for saved in self.configs:
            found += _config_changes(saved)
        for saved in self.modules:
            found += _module_changes(saved)
        flipped = [m for m in self.modules if "training" in m.settings
                   and vars(m.module).get("training") != m.settings["training"]]
        if flipped:  # one line for a mode that ``train()`` sets on a whole subtree
            first = flipped[0]
            more = f" (and {len(flipped) - 1} more modules)" if len(flipped) > 1 else ""
            found.append(Change("module settings", f"{_joined(first.name, 'training')} "
                                                   f"{first.settings['training']} -> "
                                                   f"{not first.settings['training']}{more}"))
        for key, words in GLOBAL_HOOKS.items():
            if words is not None and key in self.global_hooks:
                found += _hook_changes(words, "", self.global_hooks[key],
                                       getattr(torch_module, key))
        return tuple(sorted(found, key=lambda c: KINDS.index(c.kind)))

    def restore(self) -> None:
        """Put the model back as this state holds it (what a press added is removed)."""
        for saved in self.configs:
            now = vars(saved.config)
            for key in [k for k in now if k not in saved.values]:
                del now[key]
            for key, value in saved.values.items():
                if key not in now or not _same(value, now[key]):
                    now[key] = _put_back_value(saved.originals[key], value)
        for saved in self.modules:
            _restore_module(saved)
        for key, hooks in self.global_hooks.items():
            _put_back(getattr(torch_module, key), hooks)


def refusal(action: str, press: Any, document: str, changes: tuple[Change, ...]) -> str:
    """The one line that stops a unit whose press changed the model: the action, what it
    changed (the first :data:`SHOWN` changes), and that the model was put back."""
    kinds = list(dict.fromkeys(c.kind for c in changes))
    named = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " and " + kinds[-1]
    shown = "; ".join(c.what for c in changes[:SHOWN])
    more = f" (and {len(changes) - SHOWN} more)" if len(changes) > SHOWN else ""
    return (f"action {action!r} ({type(press).__qualname__}) changed the model's {named} on "
            f"document {document!r}: {shown}{more}; a press must leave the model as it found "
            f"it (kvdrift has put it back)")


def _named_modules(model: Any) -> list[tuple[str, Any]]:
    """Each module once, under its shortest name (kvpress makes the rotary embedding each
    attention module's too: ``model.rotary_emb``, not ``model.layers.0.self_attn.rotary_emb``)."""
    names: dict[int, tuple[str, Any]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        known = names.get(id(module))
        if known is None or name.count(".") < known[0].count("."):
            names[id(module)] = (name, module)
    return list(names.values())


def _configs(model: Any) -> list[_Config]:
    """Every config the model's modules hold, and the configs inside them, each once."""
    found: dict[int, _Config] = {}
    pending = [("", getattr(model, "config", None))]
    pending += [(f"{name}.config.", vars(m).get("config")) for name, m in _named_modules(model)]
    while pending:
        prefix, config = pending.pop(0)
        if not isinstance(config, _CONFIG) or id(config) in found:
            continue
        values = {k: v if isinstance(v, _CONFIG) else _copied(v) for k, v in vars(config).items()}
        found[id(config)] = _Config(prefix, config, values, dict(vars(config)))
        pending += [(f"{prefix}{k}.", v) for k, v in values.items() if isinstance(v, _CONFIG)]
    return list(found.values())


def _config_changes(saved: _Config) -> list[Change]:
    now = vars(saved.config)
    found = []
    for key in dict.fromkeys([*saved.values, *now]):
        before, after = saved.values.get(key, _UNSET), now.get(key, _UNSET)
        if isinstance(before, _CONFIG) and after is before:
            continue
        for path, old, new in _differences(key, before, after):
            if key == ATTENTION and not saved.prefix:
                found.append(Change("attention implementation", f"{old} -> {new}"))
            else:
                found.append(Change("config", f"{saved.prefix}{path} {_shown(old)} -> "
                                              f"{_shown(new)}"))
    return found


def _differences(path: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    """``(path, before, after)`` of each leaf that differs (dicts are walked by key)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [d for key in dict.fromkeys([*before, *after])
                for d in _differences(f"{path}.{key}", before.get(key, _UNSET),
                                      after.get(key, _UNSET))]
    return [] if _same(before, after) else [(path, before, after)]


def _settings(module: Any) -> dict[str, Any]:
    """A module's own settings: plain values (copied) and callables (kept as they are)."""
    out = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key in PER_FORWARD or key in ("config", "forward"):
            continue
        if _plain(value):
            out[key] = copy.deepcopy(value)
        elif callable(value) and not isinstance(value, torch.nn.Module):
            out[key] = value
    return out


def _module_changes(saved: _Module) -> list[Change]:
    module, found = saved.module, []
    where = saved.name or "the model"
    now = vars(module)
    for key, before in saved.settings.items():
        after = now.get(key, _UNSET)
        if key != "training" and not _same(before, after):  # training: ModelState.changes
            found.append(Change("module settings", f"{_joined(saved.name, key)} "
                                                   f"{_shown(before)} -> {_shown(after)}"))
    buffers = module._buffers  # noqa: SLF001
    for key in dict.fromkeys([*saved.buffers, *buffers]):
        if key not in saved.buffers and not _self_updating(module):
            found.append(Change("buffers", f"{_joined(saved.name, key)} added"))
        elif key in saved.buffers:
            how = _buffer_difference(saved.buffers[key][1], buffers.get(key, _UNSET))
            if how:
                found.append(Change("buffers", f"{_joined(saved.name, key)} {how}"))
    if not _same_forward(module, saved.forward, now.get("forward")):
        found.append(Change("forward methods", f"{_joined(saved.name, 'forward')} replaced by "
                                               f"{_callable_name(now.get('forward'))}"))
    for key, words in HOOKS.items():
        if words is not None and key in saved.hooks:
            found += _hook_changes(words, where, saved.hooks[key], getattr(module, key))
    return found


def _hook_changes(words: str, where: str, before: dict, after: dict) -> list[Change]:
    place = f" on {where}" if where else ""
    found = [Change("hooks", f"a {words} left{place} ({_callable_name(hook)})")
             for key, hook in after.items() if key not in before]
    found += [Change("hooks", f"a {words} removed{place} ({_callable_name(hook)})")
              for key, hook in before.items() if key not in after]
    return found


def _restore_module(saved: _Module) -> None:
    module = saved.module
    now = vars(module)
    for key, value in saved.settings.items():
        if not _same(value, now.get(key, _UNSET)):
            now[key] = _put_back_value(saved.originals[key], value)
    buffers = module._buffers  # noqa: SLF001
    if not _self_updating(module):
        for key in [k for k in buffers if k not in saved.buffers]:
            del buffers[key]
    for key, (tensor, clone) in saved.buffers.items():
        if not _buffer_difference(clone, buffers.get(key, _UNSET)) and buffers[key] is tensor:
            continue
        if tensor is not None:
            with torch.no_grad():
                if tensor.shape == clone.shape and tensor.dtype == clone.dtype:
                    tensor.copy_(clone)
                else:
                    tensor.data = clone.clone()
        buffers[key] = tensor
    if saved.buffers:
        transient = module._non_persistent_buffers_set  # noqa: SLF001
        transient.clear()
        transient.update(saved.transient)
    if now.get("forward") is not saved.forward:
        if saved.forward is None:
            now.pop("forward", None)
        else:
            now["forward"] = saved.forward
    for key, hooks in saved.hooks.items():
        _put_back(getattr(module, key), hooks)


def _put_back_value(original: Any, saved: Any) -> Any:
    """The object to put back for an attribute: the original itself, its contents restored
    from ``saved`` where it is a dict, list or set (others may hold it: a press that wrote
    ``config.rope_parameters["rope_theta"]`` changed the one dict every holder sees), a copy of
    ``saved`` where the original is some other object that may have been changed in place."""
    if original is saved or isinstance(original, _CONFIG) or (
            _plain(original) and not isinstance(original, (dict, list, set))):
        return original
    if isinstance(original, dict) and isinstance(saved, dict):
        original.clear()
        original.update(_copied(saved))
    elif isinstance(original, list) and isinstance(saved, list):
        original[:] = _copied(saved)
    elif isinstance(original, set) and isinstance(saved, set):
        original.clear()
        original.update(saved)
    else:
        return _copied(saved)
    return original


def _put_back(hooks: dict, saved: dict) -> None:
    if list(hooks.items()) != list(saved.items()):
        hooks.clear()
        hooks.update(saved)


def _buffer_difference(before: torch.Tensor | None, after: Any) -> str:
    """How a buffer differs from its saved clone, in words ("" where it does not)."""
    if after is _UNSET:
        return "removed"
    if before is None or after is None:
        return "" if before is after else f"{_shown(before)} -> {_shown(after)}"
    if after.shape != before.shape:
        return f"shape {tuple(before.shape)} -> {tuple(after.shape)}"
    if after.dtype != before.dtype or after.device != before.device:
        return f"{before.dtype} on {before.device} -> {after.dtype} on {after.device}"
    return "" if _bitwise_equal(before, after) else "values changed"


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bytes (a NaN equals itself; 0.0 and -0.0 differ)."""
    try:
        return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                           b.detach().reshape(-1).contiguous().view(torch.uint8))
    except (RuntimeError, TypeError):  # a dtype without a byte view
        return torch.equal(a, b)


def _same_forward(module: Any, before: Any, after: Any) -> bool:
    """Whether a module's own ``forward`` is as it was: the same object, or either way its
    class's own forward (kvpress puts back a bound method where there was none)."""
    return after is before or (_is_own_forward(module, before) and _is_own_forward(module, after))


def _is_own_forward(module: Any, forward: Any) -> bool:
    return forward is None or (getattr(forward, "__self__", None) is module and getattr(
        forward, "__func__", None) is getattr(type(module), "forward", None))


def _self_updating(module: Any) -> bool:
    """A rotary embedding that recomputes its frequencies as sequences grow (dynamic,
    longrope): its buffers and settings follow the lengths it ran on, not the press."""
    kind = vars(module).get("rope_type")
    kinds = kind.values() if isinstance(kind, dict) else [kind]
    return any(isinstance(k, str) and ("dynamic" in k or k == "longrope") for k in kinds)


def _plain(value: Any) -> bool:
    if isinstance(value, (type(None), bool, int, float, str, bytes, torch.dtype, torch.device)):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (a NaN equals itself; tensors bitwise)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, torch.Tensor):
        return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                and _bitwise_equal(a, b))
    if callable(a) and not _plain(a):
        return False  # not the same object
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value without a plain comparison: by identity
        return False


def _copied(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - a value that cannot be copied is kept itself
        return value


def _shown(value: Any) -> str:
    if value is _UNSET:
        return "(unset)"
    if isinstance(value, torch.Tensor):
        return f"a {tuple(value.shape)} tensor"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _callable_name(value: Any) -> str:
    func = getattr(value, "__func__", value)
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return name.replace(".<locals>.", ".")


def _joined(module: str, key: str) -> str:
    return f"{module}.{key}" if module else key


class _Unset:
    def __repr__(self) -> str:
        return "(unset)"


_UNSET = _Unset()


def _config_class() -> type:
    from transformers import PretrainedConfig

    return PretrainedConfig


_CONFIG = _config_class()

__all__ = ["Change", "ModelState", "refusal"]
