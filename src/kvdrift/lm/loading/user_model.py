"""A model the user has loaded already: measured where it is, and given back as it was found.

From Python a model need not be named and loaded by kvdrift: ``kvdrift.Model(hf_model,
tokenizer, "mine")`` hands over a transformers causal LM in memory under a name the records
carry. kvdrift runs it on its device and in its dtype and changes nothing the user would see
afterwards (:func:`left_as_found`): while it runs, the model is in eval mode and presses and
kvdrift's own attention hook into it, switch its attention implementation or add attributes
(kvpress gives every attention module the rotary embedding); after, every module's training
mode, hooks, submodules and attributes, and the config's and generation config's settings
(attention implementation, ``use_cache``) are what they were, so the same object serves
several calls and the user's own work after them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvdrift import checks
from kvdrift.lm.loading.model import DTYPES, LoadedModel

#: A module's dicts that hooks live in (torch keeps each kind of hook in its own).
HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
              "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
              "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks")


@dataclass(frozen=True)
class Model:
    """A transformers causal LM already loaded, its tokenizer, and the name its records carry.

    Example::

        path = kvdrift.embedded_model_path()
        mine = kvdrift.Model(AutoModelForCausalLM.from_pretrained(path),
                             AutoTokenizer.from_pretrained(path), "smollm2")
        kvdrift.measure(mine, ["snapkv-half"], replicates=2, horizon=8)

    :param model: a transformers causal LM (runs where it is, in its own dtype)
    :param tokenizer: its tokenizer
    :param name: the name its records carry (visible text)
    """

    model: Any  # a transformers PreTrainedModel (causal LM)
    tokenizer: Any  # its tokenizer
    name: str

    def __post_init__(self) -> None:
        checks.text(self.name, "Model name", visible=True,
                    rule="the name the records carry (visible text)")
        if not (hasattr(self.model, "config") and hasattr(self.model, "parameters")):
            raise ValueError(f"Model.model must be a transformers causal LM (a model with a "
                             f"config and parameters); got a {type(self.model).__name__}")
        if not callable(getattr(self.tokenizer, "encode", None)):
            raise ValueError(f"Model.tokenizer must be the model's transformers tokenizer; got "
                             f"a {type(self.tokenizer).__name__}")

    def __repr__(self) -> str:
        """``Model('smollm2': LlamaForCausalLM, 135M parameters, cpu, torch.float32)``: the
        name and what was handed over, never the modules' own (long) reprs."""
        params = list(self.model.parameters())
        count = sum(p.numel() for p in params)
        size = f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"
        where = f", {params[0].device}, {params[0].dtype}" if params else ""
        return f"Model({self.name!r}: {type(self.model).__name__}, {size} parameters{where})"

    def loaded(self) -> LoadedModel:
        """The model as kvdrift holds one: on its own device, in its own dtype."""
        try:
            param = next(iter(self.model.parameters()))
        except StopIteration:
            raise ValueError("Model.model has no parameters") from None
        if param.dtype not in DTYPES.values():
            raise ValueError(f"Model.model is in {param.dtype}; kvdrift measures models in "
                             f"{', '.join(DTYPES)}")
        return LoadedModel(self.model, self.tokenizer, self.name, param.device, param.dtype)


def _settings(obj: Any) -> dict[str, Any] | None:
    return dict(vars(obj)) if obj is not None and hasattr(obj, "__dict__") else None


def _restore_settings(obj: Any, saved: dict[str, Any] | None) -> None:
    if saved is None:
        return
    now = vars(obj)
    for key in [k for k in now if k not in saved]:
        del now[key]
    now.update(saved)


def _configs(model: Any) -> list[Any]:
    """The model's config, its text config where it has one, and its generation config."""
    config = getattr(model, "config", None)
    found = [config, getattr(model, "generation_config", None)]
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    if text is not None and text is not config:
        found.append(text)
    return [c for c in found if c is not None]


@contextlib.contextmanager
def left_as_found(model: Any) -> Iterator[None]:
    """Run the body with ``model`` in eval mode, then put back everything kvdrift or a press
    may have changed on it (module docstring); its weights are never written."""
    modules = list(model.modules())
    saved = []
    for m in modules:
        state = {"training": m.training, "attributes": set(vars(m)),
                 "children": dict(m._modules)}  # noqa: SLF001 - torch's own registries
        for name in HOOK_DICTS:
            hooks = getattr(m, name, None)
            if hooks is not None:
                state[name] = dict(hooks)
        saved.append((m, state))
    configs = [(c, _settings(c)) for c in _configs(model)]
    model.eval()
    try:
        yield
    finally:
        for m, state in saved:
            for name in HOOK_DICTS:
                hooks = getattr(m, name, None)
                if hooks is not None and name in state and dict(hooks) != state[name]:
                    hooks.clear()
                    hooks.update(state[name])
            if dict(m._modules) != state["children"]:  # noqa: SLF001
                m._modules.clear()  # noqa: SLF001
                m._modules.update(state["children"])  # noqa: SLF001
            for key in [k for k in vars(m) if k not in state["attributes"]]:
                delattr(m, key)
            m.training = state["training"]
        for config, settings in configs:
            _restore_settings(config, settings)
