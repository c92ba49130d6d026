"""Why ``kvdrift finite-state`` reports larger variance ratios than the paper (evidence).

For each seed, builds the 24 systems of the finite-state check (or a variant of the
system generator), enumerates both estimators' exact per-replicate laws
(:mod:`kvdrift.finite.variance`), and prints the exact summary (median of the per-system
variance ratios, variance-cost advantage) beside one simulated 512-replicate draw of the
summary that ``kvdrift finite-state`` prints. See docs/finite-state.md.

    PYTHONPATH=src python benchmarks/finite_state_variance.py --seeds 100 --variant paper
"""

from __future__ import annotations

import argparse

import numpy as np

from kvdrift.finite import FinitePair, paper_system
from kvdrift.finite.variance import Law, estimator_laws

PAPER_MEDIAN, PAPER_ADVANTAGE = 52.7, 20.0


def variant_system(c: int, seed: int, variant: str, n: int = 24, H: int = 3) -> FinitePair:
    """System ``c`` under a variant reading of the generator (``paper`` = kvdrift's)."""
    if variant in ("paper", "naive-delta"):
        return paper_system(c, n, H, seed)
    rng = np.random.default_rng([seed, c])
    u, v = float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.0, 1.0))
    base = 0.05 + 0.45 * c / n
    if variant == "v-half-to-1":  # V ~ Unif[0.5, 1] like U (same draw, rescaled)
        v = 0.5 + 0.5 * v
    lam = {"lambda-no-v": base * u, "lambda-no-uv": base, "lambda-no-u": base * v}.get(
        variant, base * u * v)
    shape, offset = (1.0, 0.05) if variant == "gamma-shape-1" else (1.5, 0.05)
    if variant == "no-offset":
        offset = 0.0
    p_table, q_table = {}, {}
    for length in range(H):
        for history in np.ndindex(*(2,) * length):
            if variant == "lambda-per-prefix":
                lam = base * rng.uniform(0.5, 1.0) * rng.uniform(0.0, 1.0)
            p = rng.gamma(shape, 1.0, size=2) + offset
            a = rng.gamma(shape, 1.0, size=2) + offset
            p, a = p / p.sum(), a / a.sum()
            p_table[tuple(history)], q_table[tuple(history)] = p, (1 - lam) * p + lam * a
    return FinitePair.from_tables(p_table, q_table, 2, H)


def _draw_var(law: Law, K: int, rng: np.random.Generator) -> float:
    return float(rng.choice(law.values, size=K, p=law.probs / law.probs.sum()).var(ddof=1))


def summary(seed: int, variant: str = "paper", replicates: int = 512) -> dict:
    laws = [estimator_laws(variant_system(c, seed, variant)) for c in range(1, 25)]
    naive = [x.naive_delta if variant == "naive-delta" else x.naive for x in laws]
    var_n = np.array([law.var for law in naive])
    var_s = np.array([x.swrb.var for x in laws])
    cost = float(np.mean([x.swrb_evaluations for x in laws])) / 3
    rng = np.random.default_rng(seed)
    mc_n = np.array([_draw_var(law, replicates, rng) for law in naive])
    mc_s = np.array([_draw_var(x.swrb, replicates, rng) for x in laws])
    return {"median": float(np.median(var_n / var_s)), "cost": cost,
            "advantage": float(var_n.sum() / var_s.sum() / cost),
            "mc_median": float(np.median(mc_n / mc_s)),
            "mc_advantage": float(mc_n.sum() / mc_s.sum() / cost),
            "mc_min": float((mc_n / mc_s).min()), "mc_max": float((mc_n / mc_s).max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--variant", default="paper",
                    choices=["paper", "naive-delta", "lambda-no-v", "lambda-no-u", "lambda-no-uv",
                             "lambda-per-prefix", "gamma-shape-1", "no-offset", "v-half-to-1"])
    ap.add_argument("--verbose", action="store_true", help="one line per seed")
    args = ap.parse_args()
    rows = []
    for seed in range(args.seeds):
        s = summary(seed, args.variant)
        rows.append(s)
        if args.verbose:
            print(f"seed {seed}: exact median {s['median']:.1f} advantage {s['advantage']:.1f} "
                  f"cost {s['cost']:.3f} | 512-replicate draw: median {s['mc_median']:.1f} "
                  f"[{s['mc_min']:.1f}, {s['mc_max']:.1f}] advantage {s['mc_advantage']:.1f}")

    def q(key: str) -> str:
        x = np.array([r[key] for r in rows])
        return (f"{np.median(x):.3g} (5-95%: {np.quantile(x, .05):.3g}-"
                f"{np.quantile(x, .95):.3g})")

    mc_med = np.array([r["mc_median"] for r in rows])
    mc_adv = np.array([r["mc_advantage"] for r in rows])
    both = ((mc_med <= PAPER_MEDIAN) & (mc_adv <= PAPER_ADVANTAGE)).mean()
    print(f"{args.variant}, {args.seeds} seeds: exact median ratio {q('median')}, "
          f"exact advantage {q('advantage')}, cost {q('cost')}; 512-replicate median ratio "
          f"{q('mc_median')} (min {q('mc_min')}, max {q('mc_max')}), advantage "
          f"{q('mc_advantage')}; share of seeds with 512-replicate "
          f"median <= {PAPER_MEDIAN}: {(mc_med <= PAPER_MEDIAN).mean():.2f}, advantage <= "
          f"{PAPER_ADVANTAGE}: {(mc_adv <= PAPER_ADVANTAGE).mean():.2f}, both: {both:.2f}")


if __name__ == "__main__":
    main()
