"""Every check of a study's settings that needs no model, in one place, made before torch,
transformers or kvpress is imported (they take seconds to load; a typo should cost a fraction
of one).

:func:`kvdrift.study_config.parse_study` calls these before it builds anything that imports
torch, so ``kvdrift run``, ``kvdrift study`` and the Python API refuse a bad action value,
estimator, dtype, device or document file in one line, in a fresh interpreter, with none of the
three loaded. Each check states its rule once, in the room that owns it (the action grammar,
the run's settings, the model's loading settings); this module only gathers them, so a new
model-free check is one line here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from kvdrift.data.sources import DocumentSource, JsonlSource
from kvdrift.lm.grammar.names import check_action_names
from kvdrift.lm.grammar.values import check_action_values
from kvdrift.lm.loading.settings import check_device_name, check_dtype_name
from kvdrift.run.settings import check_estimator_name


def check_actions(actions: Iterable[Any], defined: Collection[str] = ()) -> None:
    """Each action's names and values (``defined``: names the user's own presses give)."""
    for action in actions:
        check_action_names(action, defined=defined)
        check_action_values(action, defined=frozenset(defined))


def check_settings(*, estimator: Any, attribution: bool, dtype: Any, device: Any) -> None:
    """The estimator (and whether attribution can follow it), the dtype and the device."""
    check_estimator_name(estimator, attribution)
    check_dtype_name(dtype)
    check_device_name(device)


def check_documents(sources: Iterable[DocumentSource]) -> None:
    """Read every JSONL document file once, so a missing, unreadable or malformed one is
    refused now (a dataset from the hub, and generated documents, wait for their loader)."""
    for source in sources:
        if isinstance(source, JsonlSource):
            source.documents()
