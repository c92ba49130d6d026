"""Sampled TVs under every decoding press kvdrift replays, over 512 positions (issue 60,
item 3).

A rollout's recorded TV ``f_t`` (Q along Y before divergence, Q forced along X after: rows
forked from Y's, stepped in one joint step with P's and Y's rows, holding only their live
entries where the press allows) equals P and Q recomputed along the recorded X from the
prompt (a fresh pair, separate forwards, batches of their own, every slot kept and masked), to
:data:`TV_TOLERANCE` at every position, for every press in :data:`PRESSES`. Before the first
layer's keys and values were computed row by row (lm/engine/row_invariant.py) the ratio press
parted by up to 0.28 here: a batch of another size rounded a row's first-layer keys otherwise,
and KnormPress's exact ties in that layer (a prompt repeating a text) fell another way.

On the embedded SmolLM2 cut to its first layers (``test_lm_decoding_long.LAYERS``),
:data:`REPLICATES` rows, each of which diverges. The worst gap per press is printed (``-s``)
and recorded as the test's ``worst_tv_gap`` property (docs/decoding-presses.md, sampled TVs).
"""

from __future__ import annotations

from collections.abc import Callable

import kvpress
import pytest
import torch

from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.pair import LMKernelPair
from tests.test_lm_decoding_long import licence_model
from tests.test_lm_press_path import general_pair

STEPS = 512  # generated positions
REPLICATES = 2  # rows of a rollout; each diverges, so each has a forced path
SEED = 5
TV_TOLERANCE = 1e-4  # recorded TV against its recomputation (issue 60, item 3)


def dms() -> kvpress.DMSPress:
    """Hides keys of norm above 15 as they leave the last 64 entries (DMS has no spec)."""
    return kvpress.DMSPress(press=kvpress.KnormPress(), threshold=-15.0, sliding_window_size=64,
                            decoding=True)


PRESSES: dict[str, str | Callable[[], kvpress.BasePress]] = {
    "DecodingPress(KnormPress)": "decoding-knorm:interval=64,target=96",
    "DecodingPress(SnapKVPress)": "decoding-snapkv:interval=64,target=96,window_size=8,"
                                  "buffer=16",
    "CompressionRatioDecodingPress": "decoding-knorm:interval=64,ratio=0.5",
    "CAMPress": "cam-knorm:interval=64,target=128",
    "DMSPress(decoding=True)": dms,
    "DecodingPress(AdaKVPress)": "decoding-adakv-knorm:interval=64,target=96",
    "PrefillDecodingPress": "knorm:ratio=0.5+decoding-knorm:interval=64,ratio=0.5",
}


@pytest.fixture(scope="module")
def shallow(embedded_smollm2):
    with licence_model(embedded_smollm2) as made:
        yield made


def make_pair(model, ids, name: str) -> LMKernelPair:
    """A fresh pair for the press (CAMPress: its Q rows numbered from 0 again)."""
    press = PRESSES[name]
    if callable(press):
        return general_pair(model, ids, press())
    return LMKernelPair(model, ids, press)


def recomputed_gaps(pair: LMKernelPair, r) -> torch.Tensor:
    """``[K, H]``: |recorded TV - TV of P and Q stepped along the recorded X by ``pair``|."""
    from kvdrift.coupling import absorb_eos, tempered_probs, tv_distance

    k = r.x.shape[0]
    p_state, q_state = pair.start("p", k), pair.start("q", k)
    done = torch.zeros(k, dtype=torch.bool)
    gaps = torch.zeros(k, STEPS, dtype=torch.float64)
    for t in range(STEPS):
        p = absorb_eos(tempered_probs(pair.logprobs(p_state), 1.0), done, pair.eos_token_id)
        q = absorb_eos(tempered_probs(pair.logprobs(q_state), 1.0), done, pair.eos_token_id)
        gaps[:, t] = (r.f[:, t] - tv_distance(p, q)).abs().double()
        done = r.x_eos[:, t]
        if t + 1 < STEPS:  # P and Q along X in one step: 2K rows (the rollout's: 2K + forced)
            p_state, q_state = pair.advance_many([p_state, q_state], [r.x[:, t], r.x[:, t]])
    return gaps


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PRESSES))
def test_recorded_tvs_equal_a_recomputation_along_the_recorded_paths(shallow, name,
                                                                     record_property):
    from kvdrift.estimate import coupled_rollouts

    model, ids = shallow
    pair = make_pair(model, ids, name)
    press = PRESSES[name]
    assert (type(press()).__name__ if callable(press) else
            parse_action(press).kvpress_call()).startswith(name.split("(")[0])
    r = coupled_rollouts(pair, REPLICATES, STEPS, temperature=1.0, seed=SEED)
    assert bool((r.tau > 0).all()), r.tau.tolist()  # every row has a forced path
    gaps = recomputed_gaps(make_pair(model, ids, name), r)
    worst = float(gaps.max())
    record_property("worst_tv_gap", worst)
    print(f"\n{name}: worst |recorded - recomputed| TV over {STEPS} positions, "
          f"{REPLICATES} rows: {worst:.2g}")
    assert worst <= TV_TOLERANCE, (name, gaps.max(dim=1).values.tolist(),
                                   (gaps > TV_TOLERANCE).double().argmax(dim=1).tolist())
    assert float(r.f[:, STEPS // 2:].mean()) > 100 * TV_TOLERANCE  # the press moved Q
