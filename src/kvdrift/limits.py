"""Every limit on a size that decides how much memory or time kvdrift spends, in one place.

A user's number (replicates, horizon, bootstrap draws, a generated length, a line of a file)
is checked against its limit before anything is allocated for it, so a typo such as
``replicates = 10**20`` is one line naming the value and the limit, never a minute of work
followed by an allocator's traceback or the kernel's out-of-memory killer. The limits are
far above any study these machines (or a GPU node) can run; docs/reliability.md ("Sizes
have limits") lists them. Each check raises ``ValueError`` in the shape of :mod:`kvdrift.checks`.
"""

from __future__ import annotations

from typing import Any

from kvdrift import checks

#: Bytes of one line of a JSON Lines file (one document): read at most this much of a line.
MAX_LINE_BYTES = 4 * 2**20
#: Documents in one study (all sources together).
MAX_DOCUMENTS = 100_000
#: Bytes of prompt text held for one study (all documents together).
MAX_DOCUMENT_BYTES = 256 * 2**20
#: Tokens of one generated (RULER) prompt: ``lengths`` in a study's ``[[documents]]``. One
#: tokenizer call at this length takes about a second, so Ctrl-C is heard during generation
#: (a call runs in Rust and hears no signal: at 2^20 tokens Ctrl-C took 8 s to land, at 10^8
#: never).
MAX_PROMPT_TOKENS = 2**18
#: Documents per stratum of a generated source (``per_stratum``).
MAX_PER_STRATUM = 10_000
#: Replicates K per document and action.
MAX_REPLICATES = 1_000_000
#: Replicates per document at one budget of a frontier search (``--max-replicates``): each
#: look adds ``--replicates`` more, so this bounds the looks and stages a search may run.
MAX_SEARCH_REPLICATES = 4096
#: Its default: at the defaults (six documents, three families, alpha 0.05, R_tv <= 0.1) a
#: budget whose mean is half the tolerance is certified in about 100% of searches and one at
#: 0.7 of it in about 73% (at 32: 55%, 9%) (benchmarks/frontier_power.py;
#: tests/test_frontier_power.py).
DEFAULT_SEARCH_REPLICATES = 128
#: Seeds: what numpy and torch take (a 64-bit signed generator seed).
MAX_SEED = 2**63 - 1
#: Prespecified endpoints sharing one alpha (``plan --endpoints``): at 10^6 the Bonferroni
#: level alpha / (2k) is still a float distinct from 0 at any alpha a study takes.
MAX_ENDPOINTS = 1_000_000
#: Integer fields of a press passed to kvpress (kernel_size, window_size, ...): what a C int
#: holds; a larger value fails inside kvpress or torch after the run has started.
MAX_PRESS_INT = 2**31 - 1
#: Generated positions H.
MAX_HORIZON = 65_536
#: Step records of one unit (K x H rows, all held in memory before they are written).
MAX_UNIT_STEPS = 20_000_000
#: Bytes of next-token distributions one replicate batch holds at a time: rows x vocabulary
#: x 8 bytes (float64) x :data:`DISTRIBUTION_COPIES` live copies (P, Q, their log-probabilities,
#: the coupling's difference and cumulative sums).
MAX_BATCH_BYTES = 32 * 2**30
DISTRIBUTION_COPIES = 8
#: Bootstrap draws of an analysis (the paper takes 2,000 or 10,000).
MAX_BOOTSTRAP = 100_000
#: Cells of the bootstrap's resampling matrix (draws x documents, 8 bytes each: 2 GiB).
MAX_BOOTSTRAP_CELLS = 2**28
#: Paths of the finite-state check's exact enumeration: ``V^(2H)`` pairs of branch histories
#: at most (V = 2: horizon H <= 12, about 10 s and 0.5 GB a system; H = 16 takes minutes and
#: 5 GB a system, H = 40 would never end).
MAX_EXACT_PATHS = 2**24
#: The narrowest interval half-width ``kvdrift plan`` sizes a study for (0.0001 percentage
#: points); a narrower one needs more documents than any study holds, and its square
#: underflows (``1e-300``).
MIN_PLAN_HALFWIDTH = 1e-6
#: Systems of the finite-state check (each one an exact enumeration and two estimators).
MAX_FINITE_SYSTEMS = 10_000
#: Seeds of the finite-state check: each system's estimators take ``seed * 1_000_003 + 2c``
#: and ``+ 1`` (``kvdrift.finite.check``), which must stay a 64-bit seed.
MAX_FINITE_SEED = (MAX_SEED - 2 * MAX_FINITE_SYSTEMS - 1) // 1_000_003
#: Bytes of a file kvdrift parses whole: a study's TOML file, a store's ``run.json``.
MAX_CONFIG_BYTES = 64 * 2**20


def _size(n: int) -> str:
    """``4194304`` -> ``"4 MiB"``: a byte limit as a reader writes it."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def shown(n: int) -> str:
    """An integer as a message shows it: ``5_000_000``; a huge one by its size (Python will
    not even print an integer of more than 4300 digits)."""
    return f"{n:_}" if abs(n) < 10**30 else f"an integer of about {len(hex(n)) * 1.2:.0f} digits"


def count(value: Any, what: str, limit: int, lo: int = 1) -> int:
    """An integer count within ``lo..limit``: below ``lo`` the usual check's message, above
    ``limit`` one line naming the value and the limit."""
    value = checks.integer(value, what, lo)
    if value > limit:
        raise ValueError(f"{what} must be at most {limit:_} (kvdrift's limit); got "
                         f"{shown(value)}")
    return value


def replicates(value: Any, what: str = "replicates K") -> int:
    return count(value, what, MAX_REPLICATES)


def horizon(value: Any, what: str = "horizon H") -> int:
    return count(value, what, MAX_HORIZON)


def seed(value: Any, what: str = "seed", most: int = MAX_SEED) -> int:
    """A seed within ``0..most`` (numpy and torch refuse larger ones mid-run; ``most`` is
    lower where seeds are derived from it, as the finite-state check's)."""
    return checks.integer(value, what, 0, most)


def endpoints(value: Any, what: str = "endpoints") -> int:
    """A count of prespecified endpoints sharing alpha within ``1..MAX_ENDPOINTS``."""
    return count(value, what, MAX_ENDPOINTS)


def search_replicates(replicates_: Any, most: Any,
                      names: tuple[str, str] = ("replicates", "max_replicates")) -> None:
    """A frontier's replicates per look and most replicates per budget: each within
    ``1..MAX_SEARCH_REPLICATES``, the most at least one look (``names``: as the user set them,
    e.g. the command line's flags)."""
    count(replicates_, names[0], MAX_SEARCH_REPLICATES)
    count(most, names[1], MAX_SEARCH_REPLICATES)
    if most < replicates_:
        raise ValueError(f"{names[1]} must be at least {names[0]} ({replicates_}); got {most}")


def bootstrap(value: Any, lo: int = 0) -> int:
    return count(value, "bootstrap draws", MAX_BOOTSTRAP, lo)


def plan_halfwidth(value: Any) -> float:
    """A target half-width for ``kvdrift plan``: a finite number of at least
    :data:`MIN_PLAN_HALFWIDTH`."""
    return checks.number(value, "the target half-width", MIN_PLAN_HALFWIDTH,
                         rule=f"a finite number >= {MIN_PLAN_HALFWIDTH:g} (kvdrift's limit; "
                         "0.01 = 1 percentage point)")


def bootstrap_matrix(draws: int, documents_: int) -> None:
    """A resampling matrix of ``draws x documents_`` within :data:`MAX_BOOTSTRAP_CELLS`."""
    if draws * documents_ > MAX_BOOTSTRAP_CELLS:
        most = MAX_BOOTSTRAP_CELLS // max(documents_, 1)
        raise ValueError(f"bootstrap draws must be at most {most:_} for {documents_:_} documents "
                         f"(kvdrift's limit: {MAX_BOOTSTRAP_CELLS:_} draws x documents); got "
                         f"{shown(draws)}")


def unit_steps(replicates_: int, horizon_: int,
               names: tuple[str, str] = ("replicates K", "horizon H")) -> None:
    """K x H step records of one unit within :data:`MAX_UNIT_STEPS`."""
    if replicates_ * horizon_ > MAX_UNIT_STEPS:
        raise ValueError(f"{names[0]} x {names[1]} must be at most {MAX_UNIT_STEPS:_} step "
                         f"records per unit (kvdrift's limit); got {shown(replicates_)} x "
                         f"{shown(horizon_)} = {shown(replicates_ * horizon_)}")


def batch_memory(rows: int, vocab: int, model: str) -> None:
    """A replicate batch of ``rows`` rows over a vocabulary of ``vocab`` tokens within
    :data:`MAX_BATCH_BYTES`; the message says to lower ``batch``."""
    need = rows * vocab * 8 * DISTRIBUTION_COPIES
    if need > MAX_BATCH_BYTES:
        fits = max(MAX_BATCH_BYTES // (vocab * 8 * DISTRIBUTION_COPIES), 1)
        raise ValueError(f"a replicate batch of {rows:_} rows over {model}'s {vocab:_}-token "
                         f"vocabulary needs about {need / 2**30:.0f} GiB, above kvdrift's limit "
                         f"of {_size(MAX_BATCH_BYTES)}; set batch to at most {fits:_} "
                         "(--batch, or batch in [study])")


def exact_paths(vocab: int, horizon_: int) -> None:
    """The exact enumeration of a finite system (``vocab^(2H)`` paths) within
    :data:`MAX_EXACT_PATHS`."""
    if vocab < 2:  # one token: one path
        return
    most = 0  # the longest horizon within the limit (no power of a huge H is computed)
    while vocab ** (2 * (most + 1)) <= MAX_EXACT_PATHS:
        most += 1
    if horizon_ > most:
        raise ValueError(f"horizon H must be at most {most} for the exact enumeration of "
                         f"{vocab}-token systems ({vocab}^(2H) paths, kvdrift's limit "
                         f"{MAX_EXACT_PATHS:_}); got {horizon_}")


def line_too_long(where: str) -> ValueError:
    """The refusal of a line longer than :data:`MAX_LINE_BYTES` (``where``: file and line)."""
    return ValueError(f"{where}: a line must be at most {_size(MAX_LINE_BYTES)} (kvdrift's "
                      "limit on one document); this one is longer")


def too_many_documents(where: str, n: int, held: int) -> str:
    """Why ``n`` documents holding ``held`` bytes of prompt text are refused (``where``: the
    file and line, the source, where the count crossed a limit)."""
    if n > MAX_DOCUMENTS:
        return (f"{where}: a study must hold at most {MAX_DOCUMENTS:_} documents (kvdrift's "
                f"limit); got {shown(n)}")
    return (f"{where}: a study's prompts must hold at most {_size(MAX_DOCUMENT_BYTES)} of text "
            f"(kvdrift's limit); the documents so far hold {held:_} bytes")


def documents(docs: Any, where: str) -> None:
    """A study's documents (all sources) within :data:`MAX_DOCUMENTS` and
    :data:`MAX_DOCUMENT_BYTES`."""
    held = sum(len(d.prompt.encode("utf-8", "surrogatepass")) for d in docs)
    if len(docs) > MAX_DOCUMENTS or held > MAX_DOCUMENT_BYTES:
        raise ValueError(too_many_documents(where, len(docs), held))


def read_bounded(path: Any, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file kvdrift parses whole, read only up to ``limit``; over it,
    one line naming the file and the limit (a device or FIFO is refused, never read:
    :func:`kvdrift.output.open_regular`)."""
    from kvdrift.output import open_regular

    with open_regular(path) as handle:
        return bounded(handle.read(limit + 1), path, limit)


def bounded(data: bytes, path: Any, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """``data`` read from ``path`` (at most ``limit + 1`` bytes), refused if over ``limit``."""
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {_size(limit)}, kvdrift's limit on a file it "
                         "reads whole (a study's TOML file, a run.json)")
    return data


def finite_study(systems: Any, replicates_: Any, horizon_: Any, seed_: Any) -> None:
    """The finite-state check's sizes (``kvdrift finite-state``), before anything runs:
    binary systems enumerated exactly up to the horizon, at least two replicates (to estimate
    a variance)."""
    replicates(replicates_)
    horizon(horizon_)
    exact_paths(2, horizon_)
    count(systems, "systems", MAX_FINITE_SYSTEMS)
    seed(seed_, most=MAX_FINITE_SEED)  # the estimators' seeds derive from it
    checks.integer(replicates_, "replicates", 2,
                   rule="an integer >= 2 (to estimate a variance)")
