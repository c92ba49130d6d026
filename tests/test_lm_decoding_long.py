"""Decoding presses replayed over 512 generated positions (issue 60, item 2).

At temperature 0 each Q row equals kvpress's own ``generate`` inside the same press over 512
positions, on the embedded SmolLM2 cut to its first :data:`LAYERS` layers (the whole model
costs 30 layers per step; the first ones are where KnormPress meets its exact ties: a prompt
repeating a licence text gives a hundred equal scores in layer 0), for every kind of decoding
press kvdrift replays (:data:`SPECS`: ``DecodingPress`` and ``CompressionRatioDecodingPress``
over a scorer, over ``AdaKVPress``, after a prefill press, ``DMSPress(decoding=True)``,
``CAMPress``). Every compression is checked too: kvdrift scores the same entries in the same
order as kvpress (scores equal to float noise) and keeps the same ones in the same order
(``topk`` on equal values; under ``AdaKVPress`` hides the same entries per KV head; under
``DMSPress`` hides each entry leaving the window in the same KV heads). Where the two can part
(kvdrift's attention is exact but not bit-identical to ``generate``'s), the test requires the
first difference to be float noise at a near tie: a compression whose two best candidates for
a place lie within :data:`SCORE_MARGIN` of each other (under ``DMSPress``: a score within it of
the threshold), or a position whose two best tokens lie within :data:`LOGIT_MARGIN`. Sampled
TVs under every decoding press are in tests/test_lm_decoding_long_tvs.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import kvpress
import pytest
import torch
from kvpress.utils import compute_n_kept

from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.decoding import DecodingRule
from kvdrift.lm.engine.decoding_cam import merge_seed
from kvdrift.lm.engine.pair import LMKernelPair
from tests.test_lm_press_path import general_pair, greedy_q

STEPS = 512  # generated positions compared
LAYERS = 4  # SmolLM2's first layers kept (test_lm_decoding_presses runs all 30 over 256)
SCORE_MARGIN = 1e-5  # a near tie in a compression's scores, relative to their largest magnitude
LOGIT_MARGIN = 1e-4  # a near tie between the two best tokens' logits
WINDOW = 64  # attention inputs a compression scores from, at most (the prompt is longer)
DMS_WINDOW = 64  # DMSPress's sliding window
DMS_THRESHOLD = -17.0  # KnormPress's score is minus the key's norm: keys above 17 are hidden
TEXT = ("Here is a licence: permission is granted to use, copy, modify and distribute this "
        "software for any purpose, provided that the notice above appears in all copies. ")


def dms() -> kvpress.DMSPress:
    """DMSPress has no spec: a press object (kvdrift's general path)."""
    return kvpress.DMSPress(press=kvpress.KnormPress(), threshold=DMS_THRESHOLD,
                            sliding_window_size=DMS_WINDOW, decoding=True)


SPECS = {  # every kind of decoding press kvdrift replays: a spec, or a press object's maker
    "CAMPress": "cam-knorm:interval=64,target=128",  # parted at t = 260 before issue 60
    "DecodingPress(SnapKVPress)": "decoding-snapkv:interval=64,target=96,window_size=8,"
                                  "buffer=16",  # parted at t = 511 before issue 60
    "CompressionRatioDecodingPress": "decoding-knorm:interval=64,ratio=0.5",
    "DecodingPress(KnormPress)": "decoding-knorm:interval=64,target=96",  # layer 0's ties
    "DecodingPress(AdaKVPress)": "decoding-adakv-knorm:interval=64,target=96",
    "PrefillDecodingPress": "knorm:ratio=0.5+decoding-snapkv:interval=64,target=96,"
                            "window_size=8,buffer=16",  # ties at prefill, then SnapKV
    "DMSPress": dms,
}


@contextlib.contextmanager
def first_layers(model, n: int):
    """``model`` with only its first ``n`` decoder layers (restored on exit)."""
    layers, count = model.model.layers, model.config.num_hidden_layers
    model.model.layers = torch.nn.ModuleList(list(layers)[:n])
    model.config.num_hidden_layers = n
    try:
        yield model
    finally:
        model.model.layers, model.config.num_hidden_layers = layers, count


@contextlib.contextmanager
def licence_model(loaded):
    """The loaded model cut to its first :data:`LAYERS` layers, and a prompt repeating a
    licence text (layer 0's exact KnormPress ties)."""
    from kvdrift.lm.loading.model import encode_prompt

    ids = encode_prompt(loaded.tokenizer, TEXT * 3 + "Write a long commentary on this licence.")
    with first_layers(loaded.model, LAYERS) as model:
        yield model, ids


@pytest.fixture(scope="module")
def shallow(embedded_smollm2):
    with licence_model(embedded_smollm2) as made:
        yield made


@dataclass(frozen=True)
class Compression:
    """One scoring call of a compression: its layer, the scores ``[kv, m]`` (CAMPress: their
    mean over KV heads ``[1, m]``), the entries kept after it (cache indices in kvpress's
    order ``[kv, n]``, or under AdaKVPress a mask ``[kv, m]`` of the entries left shown), and
    the forward (1: the prefill) it happened in."""

    layer: int
    scores: torch.Tensor
    kept: torch.Tensor
    forward: int


class Recorder:
    """Records every decoding compression's scores (a spy on the scorer class's ``score``);
    with ``adaptive``, what ``AdaKVPress.compress`` leaves shown (its ``masked_key_indices``)."""

    def __init__(self, monkeypatch, scorer: type, keep, adaptive: bool = False) -> None:
        self.calls: list[Compression] = []
        self.forward = 0
        score, recorder = scorer.score, self

        def spy(press, module, hidden, keys, values, attentions, kwargs):
            scores = score(press, module, hidden, keys, values, attentions, kwargs)
            if hidden.shape[1] <= WINDOW:  # decoding (the prompt is longer)
                s = scores.detach()[0].clone()  # (AdaKVPress writes into its scores)
                n = compute_n_kept(s.shape[-1], press.compression_ratio)
                recorder.calls.append(Compression(int(module.layer_idx), s, keep(s, n),
                                                  recorder.forward))
            return scores

        monkeypatch.setattr(scorer, "score", spy)
        if not adaptive:
            return
        compress = kvpress.AdaKVPress.compress

        def shown(press, module, hidden, keys, values, attentions, kwargs):
            seen = len(recorder.calls)
            out = compress(press, module, hidden, keys, values, attentions, kwargs)
            if len(recorder.calls) > seen:
                _, heads, places = module.masked_key_indices
                mask = torch.ones(keys.shape[1:3], dtype=torch.bool)
                mask[heads.cpu(), places.cpu()] = False
                recorder.calls[-1] = dataclasses.replace(recorder.calls[-1], kept=mask)
            return out

        monkeypatch.setattr(kvpress.AdaKVPress, "compress", shown)

    def counting(self, model):
        def hook(*_):
            self.forward += 1
        return model.register_forward_pre_hook(hook)


def first_near_tie(a: Compression, b: Compression) -> float | None:
    """Why kvpress's compression ``a`` and kvdrift's ``b`` may keep different entries: None if
    they score the same entries (equal to float noise) and keep the same ones in the same
    order; else a near tie, or AssertionError (a bug, not noise)."""
    assert a.layer == b.layer and a.scores.shape == b.scores.shape, (a.layer, b.layer)
    assert a.kept.shape == b.kept.shape, f"layer {a.layer}: kvdrift keeps another count"
    if a.kept.dtype == torch.bool:  # AdaKVPress: hidden entries score their fake keys
        return first_near_tie_shown(a, b)
    scale = float(a.scores.abs().max())
    assert torch.allclose(a.scores, b.scores, rtol=0, atol=1e-4 * scale), \
        f"layer {a.layer}: kvdrift scores other entries than kvpress"
    if torch.equal(a.kept, b.kept):
        return None
    assert not torch.equal(a.scores, b.scores), \
        f"layer {a.layer}: kept sets part on equal scores (ties broken otherwise than topk)"
    head, place = (int(x) for x in torch.nonzero(a.kept != b.kept)[0])
    ours, theirs = int(a.kept[head, place]), int(b.kept[head, place])
    gap = abs(float(a.scores[head, ours] - a.scores[head, theirs]))
    assert gap <= SCORE_MARGIN * scale, \
        f"layer {a.layer}: kept sets part at a score gap {gap:.3g}, not a near tie"
    return gap


def first_near_tie_shown(a: Compression, b: Compression) -> float | None:
    """:func:`first_near_tie` under AdaKVPress: ``kept`` masks the entries left shown. The
    fake keys over hidden entries have norms far above any key's, so the scale is that of the
    entries ``a`` shows, and the fake keys' scores are compared relative to themselves."""
    scale = float(a.scores[a.kept].abs().max())
    assert torch.allclose(a.scores, b.scores, rtol=1e-4, atol=1e-4 * scale), \
        f"layer {a.layer}: kvdrift scores other entries than kvpress"
    assert int(a.kept.sum()) == int(b.kept.sum()), \
        f"layer {a.layer}: kvdrift hides another count than kvpress"
    if torch.equal(a.kept, b.kept):
        return None
    assert not torch.equal(a.scores, b.scores), \
        f"layer {a.layer}: hidden entries part on equal scores (ties broken otherwise)"
    ours = tuple(torch.nonzero(a.kept & ~b.kept)[0].tolist())  # shown by kvpress only
    theirs = tuple(torch.nonzero(b.kept & ~a.kept)[0].tolist())  # shown by kvdrift only
    gap = abs(float(a.scores[ours] - a.scores[theirs]))
    assert gap <= SCORE_MARGIN * scale, \
        f"layer {a.layer}: hidden entries part at a score gap {gap:.3g}, not a near tie"
    return gap


def keep_topk(spec: str):
    """How the press keeps ``n`` entries by scores ``[kv, m]``, in kvpress's cache order:
    ``topk`` order (CAMPress: the best mean over KV heads, in cache order)."""
    if spec.startswith("cam-"):
        return lambda s, n: torch.sort(s.mean(dim=0, keepdim=True).topk(n, dim=-1).indices,
                                       dim=-1).values
    return lambda s, n: s[None].topk(n, dim=-1).indices[0]  # as kvpress: [1, kv, m]


class EntryScores:
    """DMSPress's scores of each generated entry ``[kv]``, by (layer, cache index): a spy on
    its scorer's ``score`` where it scores one entry (kvpress as the entry is written, kvdrift
    as it leaves the window)."""

    def __init__(self, monkeypatch, scorer: type) -> None:
        self.scores: dict[tuple[int, int], torch.Tensor] = {}
        score, scores = scorer.score, self.scores

        def spy(press, module, hidden, keys, values, attentions, kwargs):
            out = score(press, module, hidden, keys, values, attentions, kwargs)
            if keys.shape[2] == 1:
                place = int(kwargs["cache_position"][-1])
                scores[int(module.layer_idx), place] = out.detach()[0, :, 0].clone()
            return out

        monkeypatch.setattr(scorer, "score", spy)


def dms_parted_at(theirs: EntryScores, ours: EntryScores, n: int,
                  steps: int) -> tuple[int, float | None, int | None]:
    """The first forward whose hidden entries may differ between kvpress (``theirs``) and
    kvdrift (``ours``) under :func:`dms` over ``steps`` positions, the distance of the
    entry's score from the threshold there and its layer; ``(steps, None, None)`` if none
    (AssertionError where they score an entry apart, or part on it by more than noise)."""
    last = n + steps - 1 - DMS_WINDOW  # the last entry kvdrift's steps move out
    left = {key for key in theirs.scores if key[1] <= last}
    assert left and left <= set(ours.scores), "kvdrift scores other entries than kvpress"
    decided = torch.stack([theirs.scores[key] < DMS_THRESHOLD for key in left])
    assert bool(decided.any()) and not bool(decided.all())  # the threshold hides some
    for layer, place in sorted(left, key=lambda key: (key[1], key[0])):
        a, b = theirs.scores[layer, place], ours.scores[layer, place]
        scale = float(a.abs().max())
        assert torch.allclose(a, b, rtol=0, atol=1e-4 * scale), (layer, place)
        apart = (a < DMS_THRESHOLD) != (b < DMS_THRESHOLD)
        if bool(apart.any()):
            gap = float((a - DMS_THRESHOLD)[apart].abs().max())
            assert gap <= SCORE_MARGIN * scale, \
                f"layer {layer}: entry {place} hidden apart at {gap:.3g} from the threshold"
            return place + DMS_WINDOW - n + 2, gap, layer  # the forward hiding it
    return steps, None, None


def decoding_press(press):
    """The decoding stage of ``press`` (a ``PrefillDecodingPress``'s, or itself)."""
    return getattr(press, "decoding_press", None) or press


def make_press(name: str, n: int):
    spec = SPECS[name]
    return spec() if callable(spec) else parse_action(spec).make_press(n)


def kvdrift_pair(model, ids, name: str) -> LMKernelPair:
    spec = SPECS[name]
    return general_pair(model, ids, spec()) if callable(spec) else \
        LMKernelPair(model, ids, spec)


@dataclass(frozen=True)
class Comparison:
    """kvdrift's greedy row (``got``) against kvpress's ``generate`` (``want``) inside one press:
    the first position they part at (None: never), the two best logits' gap there in
    ``generate``, and the first forward (1: the prefill) whose compression parted at a near
    tie, with that tie's score gap and layer (``parted_at`` = the steps compared, ``tie``
    None: none)."""

    want: list[int]
    got: list[int]
    t: int | None
    logit_gap: float | None
    parted_at: int
    tie: float | None
    tie_layer: int | None
    compressions: int  # kvpress's scoring calls (DMSPress: entries scored as they leave)


def compare(model, ids, name: str, monkeypatch, steps: int = STEPS) -> Comparison:
    """Run :data:`SPECS` ``name`` both ways over ``steps`` positions, every compression
    compared (AssertionError where they score other entries, or part by more than noise)."""
    n = ids.shape[1]
    press = make_press(name, n)
    assert type(press).__name__ == name.split("(")[0]
    stage = decoding_press(press)
    threshold = isinstance(stage, kvpress.DMSPress)
    adaptive = isinstance(getattr(stage, "base_press", None), kvpress.AdaKVPress)
    scorer = type(stage.press if threshold else stage.base_press.press if adaptive else
                  stage.base_press)
    cam = isinstance(stage, kvpress.CAMPress)
    keep = keep_topk("cam-" if cam else "")

    def spy():
        return EntryScores(monkeypatch, scorer) if threshold else \
            Recorder(monkeypatch, scorer, keep, adaptive)

    theirs = spy()
    handle = None if threshold else theirs.counting(model)
    try:
        with torch.random.fork_rng(), press(model), torch.no_grad():
            torch.manual_seed(merge_seed(0, 0))  # CAMPress's merges: Q row 0's seed
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=steps, min_new_tokens=steps,
                                 output_scores=True, return_dict_in_generate=True)
    finally:
        if handle is not None:
            handle.remove()
    want = out.sequences[0, n:].tolist()
    monkeypatch.undo()
    ours = spy()
    if not (threshold or adaptive or cam):  # kvdrift's own topk (else: the press's compress)
        compress_row = DecodingRule.compress_row

        def kept_by_kvdrift(rule, module, entries):
            seen = len(ours.calls)
            kept = compress_row(rule, module, entries)
            if len(ours.calls) > seen:
                ours.calls[-1] = dataclasses.replace(ours.calls[-1], kept=kept.order)
            return kept

        monkeypatch.setattr(DecodingRule, "compress_row", kept_by_kvdrift)
    got = greedy_q(kvdrift_pair(model, ids, name), steps)
    monkeypatch.undo()
    if threshold:
        parted_at, tie, layer = dms_parted_at(theirs, ours, n, steps)
        count = len(theirs.scores)
    else:  # compressions after 64, 128, ... generated (and after the last, generate never runs)
        assert len(theirs.calls) >= (steps // 64 - 1) * model.config.num_hidden_layers
        assert len(ours.calls) >= len(theirs.calls)
        parted_at, tie, layer, count = steps, None, None, len(theirs.calls)
        for a, b in zip(theirs.calls, ours.calls, strict=False):
            tie = first_near_tie(a, b)
            if tie is not None:
                # the forward writing token L compresses: L + 2 reads it
                parted_at, layer = a.forward, a.layer
                break
    t = next((i for i, (x, y) in enumerate(zip(got, want, strict=True)) if x != y), None)
    top = None if t is None else out.scores[t][0].float().topk(2).values
    return Comparison(want, got, t, None if top is None else float(top[0] - top[1]),
                      parted_at, tie, layer, count)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_decoding_presses_equal_generate_over_512_positions(shallow, monkeypatch, name):
    model, ids = shallow
    c = compare(model, ids, name, monkeypatch)
    if c.t is None or c.t >= c.parted_at:
        return  # equal, or the kept entries parted at a near tie before position t
    assert c.logit_gap <= LOGIT_MARGIN, \
        f"{name}: parts from generate at t = {c.t}, not at a near tie"

