"""What to tell a user whose hub-trained press could not find its files.

kvpress's hub-trained presses (QFilter, KVzap, RestoreKV, FastKVzip, ExpectedAttentionStats)
build the hub id of their trained files from the model's ``config.name_or_path``, most from its
last path component (``nthngdy/<name>_qfilt``, ``nvidia/KVzap-<type>-<name>``). A model loaded
from a local folder has a folder's name there, not a hub id: such a press cannot find its files
by construction, and putting "the file" in the cache is no advice. Where the press takes a
local path (ExpectedAttentionStatsPress's ``stats_folder``), that is the way; otherwise it is a
trained part set on the press before the run, or the model loaded by its hub id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: A press's argument that names its files locally.
LOCAL_ARGUMENTS = {
    "ExpectedAttentionStatsPress": "stats_folder= (a folder with its statistics, as "
                                   "ExpectedAttentionStats.save_pretrained writes it)",
}
#: A press's trained part that can be set on the object before the run (what it loads).
PRESET_PARTS = {
    "QFilterPress": "q_filters (QFilters.from_pretrained(<a local folder>).q_filters)",
    "KVzapPress": "kvzap_model and kvzap_model_name (KVzapModel.from_pretrained(<a local "
                  "folder>), and the id it would build)",
}


def missing_files_message(hub: str, press: Any, name_or_path: str) -> str:
    """One sentence: which hub file a press looked for, why it was not found, and how to
    supply it (module docstring)."""
    cls = type(press).__name__
    how = next((f"give {cls} {LOCAL_ARGUMENTS[c]}" for c in _names(press)
                if c in LOCAL_ARGUMENTS), None)
    if how is None:
        how = next((f"{cls} takes no local path: set its {PRESET_PARTS[c]} on the press "
                    f"before the run" for c in _names(press) if c in PRESET_PARTS), None)
    if name_or_path and os.path.isdir(name_or_path):
        what = (f"it looks for {hub} on the Hugging Face hub, an id it builds from the model's "
                f"folder name ({Path(name_or_path).name!r}); a model loaded from a local folder "
                f"has no hub id, so it cannot find its files by construction")
        how = how or (f"{cls} takes no local path: load the model by its hub id, with the "
                      f"press's files in the local Hugging Face cache")
    else:
        what = f"it needs {hub} from the Hugging Face hub, which is not in the local cache"
        how = how or "runs are offline: put the press's files in the local Hugging Face cache"
    return f"{what} ({how})"


def _names(press: Any) -> list[str]:
    return [c.__name__ for c in type(press).__mro__]
