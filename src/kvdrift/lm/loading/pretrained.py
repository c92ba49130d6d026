"""Where a model's files come from, and the options every ``from_pretrained`` call gets.

Two rules hold for every model, tokenizer and config that kvdrift loads:

- **No model's own Python runs.** Every call passes ``trust_remote_code=False``: a model
  directory (or hub repository) whose ``config.json`` points at its own code (``auto_map``)
  for an architecture transformers does not implement is refused, never executed, and never
  prompts on stdin.
- **No network unless asked for.** A name is looked up as a local directory, then in the
  local Hugging Face cache, without a request; a name found in neither is refused in one line.
  Downloading is an explicit opt-in: ``--allow-download`` on the command line, or the
  environment variable ``HF_HUB_OFFLINE=0``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

EMBEDDED_MODEL = "smollm2"
DOWNLOAD_ENV = "HF_HUB_OFFLINE"
_FALSE = ("0", "false", "no", "off")

ALLOWED = ("allowed: 'smollm2' (embedded), a local model directory, or a Hugging Face hub id "
           "already in the local cache (runs are offline; --allow-download or HF_HUB_OFFLINE=0 "
           "to download)")


#: Seconds to wait for the hub's address before a download is given up (no retries).
HUB_TIMEOUT = 5.0


def allowed_text(allow_download: bool = False) -> str:
    """What a model name may be; advises downloading only where it was not already asked for."""
    if allow_download:
        return ("allowed: 'smollm2' (embedded), a local model directory, a Hugging Face hub id "
                "in the local cache, or one the hub serves (downloads need the network)")
    return ALLOWED


class HubUnreachable(ValueError):
    """A download was asked for, but the hub cannot be reached (one line)."""


def check_hub_reachable(name: str) -> None:
    """Refuse at once, in one line, a download when the hub cannot be reached (instead of
    huggingface_hub's retries, a minute of warnings). The endpoint is ``HF_ENDPOINT``'s."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=HUB_TIMEOUT).close()
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise HubUnreachable(f"cannot download model {name!r}: the hub {constants.ENDPOINT} "
                             f"cannot be reached ({reason}); {allowed_text(True)}") from None


def downloads_allowed(allow_download: bool = False) -> bool:
    """Whether a hub id may be downloaded: only when asked (``allow_download`` or
    ``HF_HUB_OFFLINE=0``); unset, ``HF_HUB_OFFLINE`` means offline."""
    return allow_download or os.environ.get(DOWNLOAD_ENV, "").strip().lower() in _FALSE


def cached_config(repo_id: str) -> Path | None:
    """The local Hugging Face cache's ``config.json`` of ``repo_id``, if any (no request)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except (HFValidationError, ValueError):
        return None
    return Path(found) if isinstance(found, str) else None


def custom_code_message(name_or_path: str) -> str:
    return (f"cannot load model {name_or_path!r}: it needs its own Python code (auto_map in "
            "config.json), which kvdrift never runs (trust_remote_code=False); allowed: "
            "models whose architecture transformers implements")


def refuse_custom_code(name_or_path: str, config_file: Path) -> None:
    """Refuse, in one line, a model whose ``config.json`` asks for its own code (``auto_map``)
    for an architecture transformers does not implement; reads the JSON only (transformers is
    imported only for a config that asks, so a plain model is checked in milliseconds)."""
    from kvdrift.output import NotARegularFile, open_regular

    try:
        with open_regular(config_file) as handle:  # a FIFO or device: refused, never read
            config = json.loads(handle.read().decode("utf-8"))
    except NotARegularFile:
        raise
    except (OSError, ValueError):
        return  # transformers names what is wrong with it
    if not isinstance(config, dict) or not config.get("auto_map"):
        return
    from transformers import CONFIG_MAPPING

    if config.get("model_type") not in CONFIG_MAPPING:
        raise ValueError(custom_code_message(name_or_path))


def pretrained_options(name_or_path: str | Path, allow_download: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``from_pretrained``: never remote code, local files only unless a
    download was asked for. Raises ``ValueError`` (one line) for a name that is neither a local
    directory nor in the local cache when downloads are not allowed."""
    local = Path(name_or_path).is_dir()
    online = downloads_allowed(allow_download)
    config_file = Path(name_or_path) / "config.json" if local else cached_config(str(name_or_path))
    if config_file is None and not local and not online:
        raise ValueError(f"cannot load model {str(name_or_path)!r}: not a local model directory, "
                         f"and no hub id of that name is in the local cache; {ALLOWED}")
    if config_file is not None:
        refuse_custom_code(str(name_or_path), config_file)
    return {"trust_remote_code": False, "local_files_only": local or not online}


def check_model_name(name: str, allow_download: bool = False) -> None:
    """Refuse, before anything heavy is imported, a model that cannot load without the network
    or that needs its own code (``"smollm2"``, the embedded model, always loads), and a
    download when the hub cannot be reached (:class:`HubUnreachable`); a name with an ``@``
    part (``smollm2@q8_0``) is checked as its checkpoint, the part by its grammar."""
    from kvdrift.lm.grammar.model_spec import split_p_model

    if isinstance(name, str):
        name = split_p_model(name)[0]
    if name and name != EMBEDDED_MODEL:
        pretrained_options(name, allow_download)
        if not Path(name).is_dir() and cached_config(name) is None:
            check_hub_reachable(name)  # a download is next: fail at once without the network


def unloadable_model_message(name_or_path: str, exc: Exception,
                             allow_download: bool = False) -> str:
    """One line for a model that ``from_pretrained`` could not load, naming what is allowed
    (never advising ``--allow-download`` when it was given)."""
    text = str(exc)
    if "trust_remote_code" in text or "custom code" in text:
        return custom_code_message(name_or_path)
    if isinstance(exc, OSError) and not Path(name_or_path).exists():
        where = ("neither the local cache nor the hub has it (or the hub cannot be reached)"
                 if allow_download else "no hub id of that name is in the local cache")
        return (f"cannot load model {name_or_path!r}: not a local model directory, and {where}; "
                f"{allowed_text(allow_download)}")
    reason = next((line.strip() for line in text.splitlines() if line.strip()),
                  type(exc).__name__)
    return f"cannot load model {name_or_path!r}: {reason}; {allowed_text(allow_download)}"
