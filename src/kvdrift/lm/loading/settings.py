"""The device and dtype a model is loaded with, checked without torch: a typo in ``--device``
or ``--dtype`` is refused before torch is imported. :mod:`kvdrift.lm.loading.model` resolves
them into torch objects with the same rules (a test compares the names)."""

from __future__ import annotations

from typing import Any

from kvdrift import checks

#: The dtypes a model loads in (:data:`kvdrift.lm.loading.model.DTYPES`).
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DEVICE_RULE = "one of auto, cpu, cuda, cuda:N"


def check_dtype_name(dtype: Any) -> None:
    """ValueError unless ``dtype`` names an allowed dtype (a torch dtype is left to the
    loader)."""
    if isinstance(dtype, str) or type(dtype).__module__ != "torch":
        checks.choice(dtype, "dtype", DTYPE_NAMES)


def check_device_name(device: Any) -> None:
    """ValueError unless ``device`` is ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (a torch
    device is left to the loader; whether CUDA is there is asked of torch later)."""
    if type(device).__module__ == "torch":
        return
    text = str(device)
    kind, colon, index = text.partition(":")
    if text != "auto" and (kind not in ("cpu", "cuda")
                           or (colon and not (index.isascii() and index.isdigit()))):
        raise checks.refuse("device", DEVICE_RULE, text)
