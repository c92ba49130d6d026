"""Teacher-forced and speculative readings of the coupling (docs/method.md section 10).

- The speculative identities on finite systems: an exact enumeration of Leviathan et al.'s
  speculative sampler (written here, target P, drafter Q) against exact expectations of
  kvdrift's per-path formulas (tokens per round from ``a_t``, acceptance from ``f_t``, the
  first round from ``tau``), to 1e-12.
- kvdrift's estimates (coupled rollouts, records, analysis) against that truth: z-tests with
  |z| > 4.5 (false alarm about 7e-6 each, 14 here: family below 1e-4), fixed seeds.
- Per-step numbers against a direct computation with transformers and kvpress (to 1e-5).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
import torch

from kvdrift.analysis.readings import NOT_ROLLOUT
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.analysis.speculative import (
    GAMMAS,
    acceptance_probs,
    expected_rounds,
    first_round_survival,
    generated_lengths,
)
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.finite import FinitePair, random_pair
from kvdrift.run.records import UnitKey, rollout_tables, swrb_tables
from tests.messages import whole

Z = 4.5
H = 4


# ------------------------------------------------------------------ exact enumeration


def speculative_exact(pair: FinitePair, gamma: int) -> dict[str, float]:
    """Expectations of Leviathan's speculative sampler, enumerated exactly.

    Target ``p = pair.probs("p", h)``, drafter ``q = pair.probs("q", h)`` on the accepted text
    ``h``; a round drafts ``min(gamma, H - len(h))`` tokens; the generation stops after EOS or
    at H tokens. Returns expected ``rounds``, ``tokens``, ``rejections`` (rounds ending in a
    rejection) and ``first_round[k]`` = P(the first round accepts at least k drafts).
    """
    V, Hz, eos = pair.vocab_size, pair.horizon, pair.eos_token_id

    def ended(h):
        return len(h) >= Hz or (eos is not None and len(h) > 0 and h[-1] == eos)

    @functools.cache
    def from_start(h) -> np.ndarray:  # (rounds, tokens, rejections) to finish from a round start
        if ended(h):
            return np.zeros(3)
        return np.array([1.0, 0, 0]) + within(h, min(gamma, Hz - len(h)))

    @functools.cache
    def within(h, left) -> np.ndarray:  # the rest of a round with `left` drafts to go
        p, q = pair.probs("p", h), pair.probs("q", h)
        if left == 0:  # every draft accepted: the bonus token from p
            return sum(p[x] * (np.array([0, 1.0, 0]) + from_start(h + (x,)))
                       for x in range(V) if p[x] > 0)
        out = np.zeros(3)
        residual = np.maximum(p - q, 0.0)
        e = residual.sum()
        for d in range(V):
            if q[d] == 0:
                continue
            accept = min(1.0, p[d] / q[d])
            nxt = h + (d,)
            out += q[d] * accept * (np.array([0, 1.0, 0]) + (
                np.zeros(3) if ended(nxt) else within(nxt, left - 1)))
            if accept < 1:
                for x in range(V):
                    if residual[x] > 0:
                        out += q[d] * (1 - accept) * residual[x] / e * (
                            np.array([0, 1.0, 1.0]) + from_start(h + (x,)))
        return out

    rounds, tokens, rejections = from_start(())

    def at_least(h, k) -> float:  # first round: P(the next k drafts are accepted)
        if k == 0:
            return 1.0
        if ended(h):
            return 0.0
        p, q = pair.probs("p", h), pair.probs("q", h)
        return sum(min(p[x], q[x]) * at_least(h + (x,), k - 1) for x in range(V))

    return {"rounds": rounds, "tokens": tokens, "rejections": rejections,
            "first_round": [at_least((), k) for k in range(1, Hz + 1)]}


def path_expectations(pair: FinitePair, gammas=GAMMAS) -> dict:
    """Exact ``E_X`` over X ~ P of kvdrift's per-path formulas (X stops after EOS).

    ``a_t = min(p, q)(X_t) / p(X_t)``, ``f_t = TV(p_t, q_t)`` and KL along X, summed over
    ``t <= N``; expected rounds from :func:`expected_rounds` per path.
    """
    V, Hz, eos = pair.vocab_size, pair.horizon, pair.eos_token_id
    out = {"tokens": 0.0, "f": 0.0, "a": 0.0, "kl": 0.0, "top1": 0.0, "dp": 0.0,
           "logratio": 0.0, "rounds": np.zeros(len(gammas))}

    def walk(h, prob, a, f, kl, top1, dp, lr):
        if len(h) == Hz or (eos is not None and h and h[-1] == eos):
            N = len(h)
            acc = np.ones((1, Hz))
            acc[0, :N] = a
            out["tokens"] += prob * N
            out["f"] += prob * sum(f)
            out["a"] += prob * sum(a)
            out["kl"] += prob * kl
            out["top1"] += prob * top1
            out["dp"] += prob * dp
            out["logratio"] += prob * lr
            out["rounds"] += prob * np.array(
                [expected_rounds(acc, np.array([N]), g)[0] for g in gammas])
            return
        p, q = pair.probs("p", h), pair.probs("q", h)
        tv = 0.5 * np.abs(p - q).sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            k = float(np.sum(np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)))
        agree = float(np.argmax(p) == np.argmax(q))
        for x in range(V):
            if p[x] > 0:
                walk(h + (x,), prob * p[x], a + [min(p[x], q[x]) / p[x]], f + [tv], kl + k,
                     top1 + agree, dp + q[x] - p[x], lr + np.log(p[x]) - np.log(q[x]))

    walk((), 1.0, [], [], 0.0, 0.0, 0.0, 0.0)
    return out


SYSTEMS = [dict(seed=3, mix=0.5, eos_token_id=None), dict(seed=11, mix=0.8, eos_token_id=2),
           dict(seed=19, mix=0.3, eos_token_id=0)]


@pytest.mark.parametrize("system", SYSTEMS)
def test_speculative_identities_exact(system):
    pair = random_pair(3, H, **system)
    ours = path_expectations(pair)
    for i, gamma in enumerate(GAMMAS):
        truth = speculative_exact(pair, gamma)
        assert ours["rounds"][i] == pytest.approx(truth["rounds"], abs=1e-12), gamma
        assert ours["tokens"] == pytest.approx(truth["tokens"], abs=1e-12)
        # the per-token rejection probability along X is f_t: E[rejections] = E[sum f_t]
        # only for gamma >= H (every position is then a draft, none a bonus token)
        if gamma >= H:
            assert ours["f"] == pytest.approx(truth["rejections"], abs=1e-12)
    assert ours["a"] == pytest.approx(ours["tokens"] - ours["f"], abs=1e-12)  # E a_t = 1 - f_t
    # gamma = 1 with a_t = 1: every round is a draft and a bonus token
    assert expected_rounds(np.ones((1, 4)), np.array([4]), 1)[0] == 2


def test_expected_rounds_by_hand():
    a = np.array([[1.0, 0.5, 0.0, 1.0, 1.0]])
    N = np.array([5])
    # gamma = 1: start 1: accept (a=1), bonus 2; start 3: reject (a=0); start 4: accept, bonus 5
    assert expected_rounds(a, N, 1)[0] == pytest.approx(3.0)
    # gamma = 2, start 1: 1 accepted, 2 accepted w.p. .5 -> bonus 3, next start 4 (r = 1:
    # 4, 5 accepted, no bonus needed); rejected at 2 w.p. .5 -> start 3 (rejected) -> start 4
    assert expected_rounds(a, N, 2)[0] == pytest.approx(1 + 0.5 * 1 + 0.5 * 2)
    assert expected_rounds(np.zeros((2, 5)), np.array([5, 3]), 4).tolist() == [5, 3]
    assert expected_rounds(np.ones((1, 9)), np.array([9]), 2)[0] == 3  # ceil(9 / 3)
    with pytest.raises(ValueError, match="gamma"):
        expected_rounds(a, N, 0)
    assert acceptance_probs(np.log([0.5, 0.2]), np.log([0.25, 0.4])).tolist() == [0.5, 1.0]
    assert generated_lengths(np.array([[0, 0, 1, 1], [0, 0, 0, 0]], bool)).tolist() == [3, 4]


# ------------------------------------------------------------------ estimates vs truth


def assert_close_in_se(samples, truth, what):
    samples = np.asarray(samples, dtype=float)
    se = samples.std(ddof=1) / np.sqrt(samples.size)
    assert abs(samples.mean() - truth) < Z * se + 1e-12, f"{what}: {samples.mean()} vs {truth}"


@pytest.fixture(scope="module")
def sampled():
    pair = random_pair(3, H, seed=11, mix=0.8, eos_token_id=2)
    return pair, coupled_rollouts(pair, 4000, H, seed=7)


def test_per_step_numbers_are_read_along_x(sampled):
    pair, r = sampled
    for i in range(40):
        x = r.x[i].tolist()
        for t in range(H):
            h = tuple(x[:t])
            if pair.eos_token_id in h:
                assert torch.isnan(torch.stack([r.logp_x[i, t], r.kl[i, t], r.top1[i, t]])).all()
                continue
            p, q = pair.probs("p", h), pair.probs("q", h)  # q along X, not along Y
            assert r.logp_x[i, t] == pytest.approx(np.log(p[x[t]]), abs=1e-12)
            assert r.logq_x[i, t] == pytest.approx(np.log(q[x[t]]), abs=1e-12)
            assert r.kl[i, t] == pytest.approx(np.sum(p * np.log(p / q)), abs=1e-12)
            assert r.top1[i, t] == float(np.argmax(p) == np.argmax(q))
    assert (r.tau > 0).float().mean() > 0.3  # the forced path is exercised


def test_rollout_readings_match_exact(sampled):
    pair, r = sampled
    ours = path_expectations(pair)
    N = generated_lengths(r.x_eos.numpy())
    live = np.arange(1, H + 1) <= N[:, None]
    logp, logq = r.logp_x.numpy(), r.logq_x.numpy()
    a = acceptance_probs(logp, logq)
    assert_close_in_se(N, ours["tokens"], "N")
    assert_close_in_se(np.where(live, r.f.numpy(), 0).sum(1), ours["f"], "sum f")
    assert_close_in_se(np.where(live, a, 0).sum(1), ours["a"], "sum a")
    assert_close_in_se(np.where(live, r.kl.numpy(), 0).sum(1), ours["kl"], "sum KL")
    assert_close_in_se(np.where(live, logp - logq, 0).sum(1), ours["logratio"], "log ratio")
    for g in (1, 4):
        assert_close_in_se(expected_rounds(a, N, g), ours["rounds"][GAMMAS.index(g)],
                           f"rounds gamma={g}")
    first = first_round_survival(r.tau.numpy(), r.x_eos.numpy(), H)
    truth = speculative_exact(pair, H)["first_round"]
    for k in (1, 2, 3):
        assert_close_in_se(first[:, k], truth[k], f"P(A >= {k + 1})")


def records_of(results, estimator="rollout"):
    steps, reps = [], []
    for action, res in results:
        for d in range(2):
            key = UnitKey("m", f"d{d}", action, "s")
            s, rp = (rollout_tables(key, res) if estimator == "rollout"  # two equal documents
                     else swrb_tables(key, res))
            steps.append(s.to_pandas())
            reps.append(rp.to_pandas())
    return pd.concat(steps, ignore_index=True), pd.concat(reps, ignore_index=True)


def test_analysis_entries_match_direct_computation():
    pair_a = random_pair(3, H, seed=5, mix=0.3, eos_token_id=2)
    pair_b = random_pair(3, H, seed=5, mix=0.9, eos_token_id=2)
    ra, rb = coupled_rollouts(pair_a, 200, H, seed=1), coupled_rollouts(pair_b, 200, H, seed=2)
    steps, reps = records_of([("a", ra), ("b", rb)])
    out = analyze(steps, reps, AnalysisOptions(bootstrap=50, seed=0))
    js = out.to_json()
    assert [(e["model"], e["action"]) for e in js["teacher_forced"]] == [("m", "a"), ("m", "b")]
    assert set(js["teacher_forced"][0]) == {"model", "action", "documents", "kl", "top1", "dp",
                                            "ppl_ratio", "strata"}
    assert set(js["speculative"][0]) == {"model", "action", "documents", "acceptance",
                                         "tokens_per_round", "first_round", "strata"}
    assert list(js["speculative"][0]["tokens_per_round"]) == ["1", "2", "4", "8", "16"]
    assert list(js["speculative"][0]["first_round"]) == ["1", "2", "3", "4"]
    for iv in js["teacher_forced"][0]["kl"], js["speculative"][0]["tokens_per_round"]["4"]:
        assert set(iv) == {"estimate", "lo", "hi"} and iv["lo"] <= iv["hi"]
    numbers = {}
    for name, r in (("a", ra), ("b", rb)):
        N = generated_lengths(r.x_eos.numpy())
        live = np.arange(1, H + 1) <= N[:, None]
        lp, lq = r.logp_x.numpy(), r.logq_x.numpy()

        def total(x, live=live):
            return np.where(live, x, 0).sum()
        acc = acceptance_probs(lp, lq)
        numbers[name] = {
            "kl": total(r.kl.numpy()) / N.sum(), "top1": total(r.top1.numpy()) / N.sum(),
            "dp": total(np.exp(lq) - np.exp(lp)) / N.sum(),
            "ppl_ratio": np.exp(total(lp - lq) / N.sum()),
            "acceptance": 1 - total(r.f.numpy()) / N.sum(),
            "tpr4": N.sum() / expected_rounds(acc, N, 4).sum(),
            "first2": first_round_survival(r.tau.numpy(), r.x_eos.numpy(), H)[:, 1].mean()}
        tf = out.teacher_forced[0 if name == "a" else 1]
        sp = out.speculative[0 if name == "a" else 1]
        for k in ("kl", "top1", "dp", "ppl_ratio"):
            assert getattr(tf.numbers, k).estimate == pytest.approx(numbers[name][k], rel=1e-12)
        assert sp.numbers.acceptance.estimate == pytest.approx(numbers[name]["acceptance"])
        assert sp.numbers.tokens_per_round[4].estimate == pytest.approx(numbers[name]["tpr4"])
        assert sp.numbers.first_round[2].estimate == pytest.approx(numbers[name]["first2"])
        assert tf.strata[0].stratum == "s"
        assert tf.strata[0].numbers.kl.estimate == pytest.approx(numbers[name]["kl"])
    # the contrast is minuend first: the later action (named "b" here) minus the earlier ("a"),
    # paired
    (c,) = out.teacher_forced_contrasts
    assert (c.a, c.b) == ("b", "a")
    assert c.numbers.kl.estimate == pytest.approx(numbers["b"]["kl"] - numbers["a"]["kl"])
    (sc,) = out.speculative_contrasts
    assert sc.numbers.tokens_per_round[4].estimate == pytest.approx(
        numbers["b"]["tpr4"] - numbers["a"]["tpr4"])
    assert (js["speculative_contrasts"][0]["a"], js["speculative_contrasts"][0]["b"]) == (
        "b", "a")
    # frames and the JSON round trip
    assert {"kl", "kl_lo", "kl_hi", "ppl_ratio"} <= set(out.teacher_forced_frame().columns)
    assert {"acceptance", "tokens_per_round_16", "first_round_1"} <= set(
        out.speculative_frame().columns)
    back = StudyAnalysis.from_json(js)
    assert back.to_json()["teacher_forced"] == js["teacher_forced"]
    assert back.to_json()["speculative_contrasts"] == js["speculative_contrasts"]
    # mixing the more distant Q lowers acceptance and tokens per round
    assert numbers["b"]["acceptance"] < numbers["a"]["acceptance"]
    assert numbers["b"]["tpr4"] < numbers["a"]["tpr4"]


def test_swrb_has_no_readings_and_says_why():
    pair = random_pair(3, H, seed=5, mix=0.5)
    steps, reps = records_of([("a", swrb(pair, 50, H, seed=1))], estimator="swrb")
    assert steps["kl"].isna().all()
    out = analyze(steps, reps, AnalysisOptions(bootstrap=20)).to_json()
    assert out["teacher_forced"] == [] and out["speculative"] == []
    assert NOT_ROLLOUT in out["meta"]["notes"]


def test_greedy_kl_is_infinite_where_choices_differ():
    from kvdrift.estimate.forced import forced_step

    lp = torch.log(torch.tensor([[0.6, 0.4], [0.6, 0.4]], dtype=torch.float64))
    lq = torch.log(torch.tensor([[0.7, 0.3], [0.3, 0.7]], dtype=torch.float64))
    step = forced_step(lp, lq, torch.tensor([0, 0]), 0.0, torch.tensor([False, True]))
    assert step.kl[0] == 0 and step.top1[0] == 1 and step.logp_x[0] == 0
    assert torch.isnan(step.kl[1]) and torch.isnan(step.top1[1])  # after X's EOS
    step = forced_step(lp, lq, torch.tensor([0, 0]), 0.0)
    assert step.kl[1] == float("inf") and step.top1[1] == 0


# ------------------------------------------------------------------ language model


def test_lm_per_step_numbers_match_transformers_and_kvpress(tiny_llama):
    from transformers import DynamicCache

    from kvdrift.lm.engine.pair import LMKernelPair

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 128, (1, 90), generator=gen)
    pair = LMKernelPair(tiny_llama, ids, "snapkv-half")
    T, K, steps = 0.8, 3, 8
    r = coupled_rollouts(pair, K, steps, temperature=T, seed=5)
    assert (r.tau > 0).any()  # some rows diverge: their Q comes from the forced path
    n = ids.shape[1]
    press = pair.action.make_press(n)
    for i in range(K):
        x = r.x[i:i + 1, :steps - 1]
        with torch.no_grad():
            full = tiny_llama(torch.cat([ids, x], dim=1)).logits[0, n - 1:]  # [steps, V]
            cache = DynamicCache()
            with press(tiny_llama):
                first = tiny_llama(ids, past_key_values=cache, use_cache=True).logits[0, -1:]
            kept = cache.get_seq_length()
            assert kept == n // 2
            rest = tiny_llama(x, past_key_values=cache, use_cache=True,
                              position_ids=torch.arange(n, n + steps - 1)[None],
                              cache_position=torch.arange(kept, kept + steps - 1)).logits[0]
        lp = torch.log_softmax(full.double() / T, -1)
        lq = torch.log_softmax(torch.cat([first, rest]).double() / T, -1)
        xi = r.x[i]
        live = ~torch.cat([torch.zeros(1, dtype=torch.bool), r.x_eos[i, :-1]])
        ref_kl = (lp.exp() * (lp - lq)).sum(-1)
        rows = torch.arange(steps)
        for got, want in ((r.logp_x[i], lp[rows, xi]), (r.logq_x[i], lq[rows, xi]),
                          (r.kl[i], ref_kl)):
            assert torch.allclose(got[live], want[live], atol=1e-5, rtol=0)
        top1 = (full.argmax(-1) == torch.cat([first, rest]).argmax(-1)).double()
        assert torch.equal(r.top1[i][live], top1[live])


# ------------------------------------------------------------------ SmolLM2 (slow)


class _Decoder:
    """One model with its own cache, ``rows`` histories after one prompt, each fed one token per
    step (real positions for RoPE): the prompt is prefilled once, then repeated per row."""

    def __init__(self, model, ids, rows: int, press=None):
        import contextlib

        from transformers import DynamicCache

        self.model, self.n, self.fed = model, ids.shape[1], 0
        self.cache = DynamicCache()
        with torch.no_grad(), (press(model) if press is not None else contextlib.nullcontext()):
            logits = model(ids, past_key_values=self.cache, use_cache=True).logits[0, -1]
        self.cache.batch_repeat_interleave(rows)
        self.logits = logits.expand(rows, -1)

    def feed(self, tokens: torch.Tensor) -> None:
        """Every row takes its next token (``tokens`` [rows]) at the next true position."""
        phys, rows = self.cache.get_seq_length(), tokens.shape[0]
        with torch.no_grad():
            out = self.model(tokens[:, None], past_key_values=self.cache, use_cache=True,
                             position_ids=torch.full((rows, 1), self.n + self.fed),
                             cache_position=torch.tensor([phys]))
        self.fed += 1
        self.logits = out.logits[:, -1]


def speculative_runs(target, drafter, gammas, horizon, eos, seed) -> list[dict[str, int]]:
    """Leviathan et al. 2023, Algorithm 1, one independent run per row of ``gammas`` (its
    draft length): target = full cache, drafter = the action's cache plus its own entries for
    the accepted tokens; temperature 1.

    Drafts are drawn and verified one at a time (a draft after a rejection is never looked at,
    so the outcomes are exactly the algorithm's; only the target's batched verification is
    unrolled). Each run emits one token per step (an accepted draft, a residual draw after a
    rejection, or the bonus token after ``gamma`` accepted drafts), so the runs advance in
    lockstep through one batched forward per model and step; each draws from its own generator
    (``seed + row``). A run stops after EOS or at ``horizon`` tokens. ``target``, ``drafter``:
    :class:`_Decoder` s right after the prompt with one row per run.
    """
    runs = [{"tokens": 0, "rounds": 0, "accepted": 0, "evaluated": 0} for _ in gammas]
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(gammas))]
    drafts = [0] * len(gammas)  # drafts accepted in the run's current round
    done = [False] * len(gammas)

    def draw(probs: torch.Tensor, gen: torch.Generator) -> int:
        return int(torch.multinomial(probs, 1, generator=gen))

    for _ in range(horizon):
        ps = torch.softmax(target.logits.double(), -1)
        qs = torch.softmax(drafter.logits.double(), -1)
        emitted = []
        for i, (out, gen, gamma) in enumerate(zip(runs, gens, gammas, strict=True)):
            p, q = ps[i], qs[i]
            if done[i]:
                token = eos  # a finished run's row is fed on and never read
            elif drafts[i] == gamma:  # all gamma drafts accepted: the bonus token from the target
                token, drafts[i] = draw(p, gen), 0
            else:
                if drafts[i] == 0:
                    out["rounds"] += 1
                d = draw(q, gen)
                out["evaluated"] += 1
                u = float(torch.rand(1, generator=gen, dtype=torch.float64))
                if u < min(1.0, float(p[d] / q[d])):
                    out["accepted"] += 1
                    token, drafts[i] = d, drafts[i] + 1
                else:
                    token, drafts[i] = draw((p - q).clamp_min(0.0), gen), 0
            if not done[i]:
                out["tokens"] += 1
                done[i] = token == eos or out["tokens"] == horizon
            emitted.append(token)
        if all(done):
            break
        target.feed(torch.tensor(emitted))
        drafter.feed(torch.tensor(emitted))
    return runs


def ratio_and_se(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """``mean(num) / mean(den)`` and its delta-method standard error."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    r = num.mean() / den.mean()
    return r, float(np.std(num - r * den, ddof=1) / (np.sqrt(num.size) * den.mean()))


SPEC_Z = 3.89  # two-sided false alarm 1e-4 per comparison, three comparisons


def assert_speculative_agrees(r, results, gammas, steps) -> dict:
    """kvdrift's predictions from coupled rollouts ``r`` (acceptance ``1 - F``, tokens per
    round for draft lengths 4 and ``steps``) against the speculative sampler's ``results``
    (its runs' draft lengths ``gammas``): |z| < :data:`SPEC_Z` each. Returns the predictions
    (estimate, standard error) by key."""
    N = generated_lengths(r.x_eos.numpy())
    live = np.arange(1, steps + 1) <= N[:, None]
    a = acceptance_probs(r.logp_x.numpy(), r.logq_x.numpy())
    rejections = np.where(live, r.f.numpy(), 0).sum(1)
    predicted = {"acceptance": ratio_and_se(N - rejections, N)}
    measured = {}
    for gamma in (4, steps):
        predicted[gamma] = ratio_and_se(N, expected_rounds(a, N, gamma))
        res = [x for x, g in zip(results, gammas, strict=True) if g == gamma]
        tokens = np.array([x["tokens"] for x in res])
        measured[gamma] = ratio_and_se(tokens, np.array([x["rounds"] for x in res]))
        if gamma >= steps:  # every position is a draft: acceptance per evaluated draft
            assert all(x["evaluated"] == x["tokens"] for x in res)
            measured["acceptance"] = ratio_and_se(np.array([x["accepted"] for x in res]),
                                                  tokens)
    print({k: (round(predicted[k][0], 4), round(measured[k][0], 4)) for k in predicted})
    for key in predicted:
        (p, sp), (m, sm) = predicted[key], measured[key]
        assert abs(p - m) < SPEC_Z * np.hypot(sp, sm), (key, p, m, sp, sm)
    return predicted


@pytest.mark.slow
def test_smollm2_speculative_sampler_agrees_with_predictions(embedded_smollm2):
    from kvdrift.lm.engine.pair import LMKernelPair
    from kvdrift.lm.loading.model import encode_prompt

    lm = embedded_smollm2
    text = ("The printing press spread across Europe within decades. Printers moved from city "
            "to city, carrying type, presses and skills; books became cheaper and more "
            "plentiful, and readers multiplied. ") * 5
    ids = encode_prompt(lm.tokenizer, text + "Summarise the text above in two sentences.")
    steps, runs = 16, 40
    pair = LMKernelPair(lm, ids, "snapkv-half")
    r = coupled_rollouts(pair, 64, steps, seed=1)
    press = pair.action.make_press(ids.shape[1])
    gammas = [4] * runs + [steps] * runs
    target, drafter = (_Decoder(lm.model, ids, len(gammas)),
                       _Decoder(lm.model, ids, len(gammas), press))
    assert drafter.cache.get_seq_length() == ids.shape[1] // 2
    results = speculative_runs(target, drafter, gammas, steps, pair.eos_token_id, seed=2)
    predicted = assert_speculative_agrees(r, results, gammas, steps)
    assert predicted[4][0] > 1.5  # the drafter is useful: more than 1.5 tokens per round


def test_tempered_logprobs_at_each_temperature():
    """Temperature 1 returns the log-probabilities as they are (float64); others re-normalise
    ``x / T``; 0 is the greedy point mass; negative or NaN temperatures are refused."""
    from kvdrift.estimate.forced import tempered_logprobs

    g = torch.Generator().manual_seed(40)
    lp = torch.log_softmax(torch.randn(3, 20, generator=g), dim=-1).float()
    one = tempered_logprobs(lp, 1.0)
    assert one.dtype == torch.float64 and torch.equal(one, lp.double())
    for t in (0.7, 2.0):
        want = torch.log_softmax(lp.double() / t, dim=-1)
        assert torch.allclose(tempered_logprobs(lp, t), want, atol=1e-12, rtol=0)
    greedy = tempered_logprobs(lp, 0.0)
    assert torch.equal(greedy.argmax(-1), lp.argmax(-1))
    assert bool((greedy.exp().sum(-1) == 1).all()) and int((greedy == 0).sum()) == 3
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=whole(
                f"temperature must be a finite number >= 0 (0 = greedy); got {bad!r}")):
            tempered_logprobs(lp, bad)
