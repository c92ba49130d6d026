"""What a decision costs, against the Bernstein oracle, and how fast each side decides.

One budget's test as the search runs it (``R_tv <= 0.1``, alpha 0.05 over three families of 15
budgets: the certifying side at 0.05 / 3, the "fails" side at 0.05 / 33), on a fixed table of
laws of per-replicate values (tests/frontier_worlds.py): two rare-large laws, {0,1}, Beta(1,
19), values near the tolerance, and values above it at 1.2x, 1.5x and 2x; 1, 6 and 20
documents; a cap of 128 replicates per document. Every search of a cell draws its own values
(fixed seeds), and every bet and look plan of a cell sees the same values. For each bet (this
one, issue 44's, and the one before it) the table gives the values drawn per search until the
decision, looks included (looks of 8, and for this bet looks sized to where the decision is
due, ``search.look_size``), median with its 95% interval (order statistics), and the share of
searches decided by the cap. The oracle is the fewest values at which a fixed-sample Bernstein
test that knows the true variance certifies in half of the cases at the same level (``X-bar +
sqrt(2 var log(1/a) / N) + (1 - mean) log(1/a) / (3 N) <= 0.1``, from 20,000 simulated
means per ``N``); a ratio's interval is the median's interval over it. Beside it, the best
constant stake known in advance (the least median over constant fractions, no looks): no bet
of this form can need fewer values, whatever it learns. Below both, the information floor
(``frontier_floor.py``): the fewest values by which any test valid at the same level decides
in half the cases, even one that knows the law; a row whose best constant stake sits below it
is flagged (it never should; a median at the cap is no decision). Beside the floor, the
mean-only fixed-sample test (Bentkus 2004, ``frontier_floor.py``) placed at the best single
look for the law: the best that one look of a valid test that does not bet reaches. This bet
runs three look plans: looks of 8, sized looks as before (a look may run past a multiple of
8) and the search's sized looks now (the same plan's stops and every multiple of 8 as well, so
case by case no more values than either, ``search.to_next_multiple``).

    python benchmarks/frontier_cost.py [--searches 1000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontier_floor import floors  # noqa: E402
from frontier_laws import LAWS, SCHEME, TOL  # noqa: E402
from frontier_worlds import Issue44Bet, TodaysBet  # noqa: E402

from kvdrift.frontier_search.betting import Bet, first_round_beyond  # noqa: E402
from kvdrift.frontier_search.feasibility import fewest_replicates  # noqa: E402
from kvdrift.frontier_search.measure import parse_measure  # noqa: E402
from kvdrift.frontier_search.search import look_size, to_next_multiple  # noqa: E402

CAP, LOOK = 128, 8
MEASURE = parse_measure(f"R_tv <= {TOL}")
BETS = [("this bet", Bet()), ("issue 44", Issue44Bet()), ("before 44", TodaysBet())]


def draw(law, mean: float, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return law(rng.random(shape), rng.random(shape), mean)


def decision_rounds(values: np.ndarray, bet: Bet) -> np.ndarray:
    """``[searches]`` the round at which a search's budget is decided (either side), or 0."""
    sides = [first_round_beyond(values, TOL, level, TOL, 0.0, 1.0, upper, bet)
             for level, upper in ((SCHEME.certify_level, True), (SCHEME.fail_level, False))]
    both = np.where(sides[0] > 0, sides[0], CAP + 1)
    both = np.minimum(both, np.where(sides[1] > 0, sides[1], CAP + 1))
    return np.where(both <= CAP, both, 0)


def drawn_rounds(values: np.ndarray, decided: np.ndarray, bet: Bet, plan: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Rounds drawn per search until its decision (or the cap), and its looks: ``plan`` is
    "fixed" (looks of 8), "sized" (sized looks as before this change: a look may run past a
    multiple of 8) or "aligned" (the search's sized looks: the same plan's stops, and every
    multiple of 8 too)."""
    end = np.where(decided > 0, decided, CAP)
    if plan == "fixed":
        drawn = np.minimum(np.ceil(end / LOOK) * LOOK, CAP)
        return drawn, np.ceil(drawn / LOOK)
    drawn, looks = np.empty(len(end)), np.empty(len(end))
    first = min(LOOK, fewest_replicates(MEASURE, values.shape[-1], SCHEME.alpha,
                                        SCHEME.families, bet))
    for s, t in enumerate(end):
        at, n, planned = first, 1, first
        while at < t:
            if at >= planned:  # the sized plan's next stop
                planned = at + look_size(values[s, :at], MEASURE, SCHEME, LOOK, bet)
            step = planned - at
            if plan == "aligned":  # and every multiple of 8 as well
                step = min(step, to_next_multiple(at, LOOK))
            at += min(CAP - at, step)
            n += 1
        drawn[s], looks[s] = at, n
    return drawn, looks


def constant_floor(values: np.ndarray, upper: bool) -> float:
    """Median values until the decision of the best constant stake known in advance (the
    fraction of ``1 / (high - m)`` on a grid of 0.05 to 0.95 whose median is least, chosen
    after seeing every search: no bet of this form that learns its stake can do better), no
    looks; the side that ``upper`` names."""
    level = SCHEME.certify_level if upper else SCHEME.fail_level
    x, m, room = (values, TOL, 1 - TOL) if upper else (-values, -TOL, TOL)
    best = math.inf
    for f in np.linspace(0.05, 0.95, 19):
        wealth = np.cumsum(np.log1p(f / room * (m - x)).sum(axis=-1), axis=-1)
        hit = wealth >= math.log(1 / level)
        rounds = np.where(hit.any(axis=-1), hit.argmax(axis=-1) + 1, CAP)
        best = min(best, float(np.median(rounds)))
    return best * values.shape[-1]


def median_interval(x: np.ndarray) -> tuple[float, float, float]:
    """The median and a 95% interval from order statistics."""
    x, n = np.sort(x), len(x)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(0, int(n / 2 - half)), min(n - 1, int(math.ceil(n / 2 + half)))
    return float(np.median(x)), float(x[lo]), float(x[hi])


def oracle(law, mean: float, level: float, sims: int = 20_000) -> int:
    """Fewest values at which the variance-knowing Bernstein test certifies in half the
    cases (bisection over ``N``)."""
    big = draw(law, mean, (1_000_000,), 7)
    var, log_a = float(big.var()), math.log(1 / level)

    def certifies(n: int) -> bool:
        means = np.concatenate([draw(law, mean, (min(sims, 2_000_000 // n + 1), n), 11 + k)
                                .mean(axis=1) for k in range(-(-sims // (2_000_000 // n + 1)))])
        eps = math.sqrt(2 * var * log_a / n) + (1 - mean) * log_a / (3 * n)
        return float(np.mean(means[:sims] + eps <= TOL)) >= 0.5

    lo, hi = 1, 4096
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if certifies(mid) else (mid + 1, hi)
    return lo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument("--documents", default="1,6,20")
    parser.add_argument("--laws", default="", help="the table's rows to run, e.g. 0,2 (all)")
    args = parser.parse_args()
    rows = [int(i) for i in args.laws.split(",")] if args.laws else range(len(LAWS))
    documents = [int(d) for d in args.documents.split(",")]
    print(f"values drawn per search until the decision (median [95% interval], share at the "
          f"cap), R_tv <= {TOL}, cap {CAP}, {args.searches} searches per cell; "
          f"levels {SCHEME.certify_level:.3g} (within) and {SCHEME.fail_level:.3g} (beyond)")
    start = time.process_time()
    for name, law, mean in [LAWS[i] for i in rows]:
        within = mean < TOL
        bench = oracle(law, mean, SCHEME.certify_level) if within else None
        level = SCHEME.certify_level if within else SCHEME.fail_level
        floor = floors(law, mean, TOL, level)
        print(f"{name}: information floor (median, any valid test) {floor['median']:.0f} "
              f"values (Neyman-Pearson {floor['np_median']:.0f}, the atom's "
              f"{floor['atom_median']:.0f}), {floor['wald_median']:.0f} (Wald), KL_inf "
              f"{floor['kl_inf']:.4f} per value"
              + (f"; oracle {bench}, floor / oracle {floor['median'] / bench:.2f}x"
                 if bench else "")
              + f"; the mean-only test (not a bet) at its best single look "
                f"{floor['mean_only']:.0f}"
              + (f" ({floor['mean_only'] / bench:.2f}x)" if bench else ""), flush=True)
        for docs in documents:
            values = draw(law, mean, (args.searches, CAP, docs), 1000 * docs + int(mean * 1e4))
            cells, per_search = [], {}
            for bet_name, bet in BETS:
                decided = decision_rounds(values, bet)
                plans = [("looks of 8", "fixed")] + ([("sized looks before", "sized"),
                                                      ("sized looks now", "aligned")]
                                                     if bet_name == "this bet" else [])
                for plan_name, plan in plans:
                    drawn, looks = drawn_rounds(values, decided, bet, plan)
                    per_search[bet_name, plan] = drawn
                    med, lo, hi = median_interval(drawn * docs)
                    cell = (f"{bet_name}, {plan_name}: {med:.0f} [{lo:.0f}, {hi:.0f}], "
                            f"{np.mean(decided == 0):.0%} at the cap, "
                            f"{np.mean(looks):.1f} looks, {med / floor['median']:.2f}x the "
                            "floor")
                    if bench:
                        cell += f", {med / bench:.2f}x [{lo / bench:.2f}, {hi / bench:.2f}]"
                    cells.append(cell)
            now = per_search["this bet", "aligned"]
            for other, label in ((("this bet", "sized"), "sized looks before"),
                                 (("this bet", "fixed"), "looks of 8")):
                cells.append(f"search by search, now against this bet's {label}: more values "
                             f"in {np.sum(now > per_search[other])} of {len(now)}, fewer in "
                             f"{np.sum(now < per_search[other])}")
            olds = [float(np.median(per_search[k])) for k in
                    (("this bet", "sized"), ("issue 44", "fixed"), ("before 44", "fixed"))]
            cells.append(f"cell: median now {np.median(now) * docs:.0f}, the best of sized "
                         f"looks before and both earlier bets {min(olds) * docs:.0f}: "
                         + ("as fast or faster" if np.median(now) <= min(olds) else "SLOWER"))
            best = constant_floor(values, within)
            head = (f"{name}, {docs} document(s)" + (f", oracle {bench}" if bench else "")
                    + f", floor {floor['median']:.0f}, best constant stake {best:.0f}"
                    + (f" ({best / bench:.2f}x)" if bench else "")
                    + ("" if best >= floor["median"] or best >= CAP * docs
                       else "  BELOW THE FLOOR"))
            print(head + "\n    " + "\n    ".join(cells), flush=True)
    print(f"({time.process_time() - start:.0f} CPU s)")


if __name__ == "__main__":
    main()
