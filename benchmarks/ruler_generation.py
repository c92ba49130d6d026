"""How fast the RULER-style generator fits prompts to SmolLM2's tokenizer (a speed goal, kept
out of the tests: a wall-clock bound in a test measures the machine's load, issue 52).

Generates the 21 documents of 1,000 tokens that ``tests/test_data.py`` sizes and prints the
wall and CPU seconds against the goal of 5 s (a ratio below 1 meets it).

    PYTHONPATH=src python benchmarks/ruler_generation.py
"""

from __future__ import annotations

import time

GOAL_SECONDS = 5.0


def main() -> None:
    import tokenizers

    from kvdrift.data import token_counter
    from kvdrift.data.ruler import RulerConfig, generate
    from kvdrift.lm.loading.model import smollm2_path

    count = token_counter(tokenizers.Tokenizer.from_file(str(smollm2_path() / "tokenizer.json")))
    wall, cpu = time.perf_counter(), time.process_time()
    docs = generate(RulerConfig(target_lengths=(1000,), documents_per_stratum=3), count)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{len(docs)} documents of 1,000 tokens: {wall:.2f} s wall, {cpu:.2f} s CPU; "
          f"ratio to the {GOAL_SECONDS:.0f} s goal: {wall / GOAL_SECONDS:.2f} (wall), "
          f"{cpu / GOAL_SECONDS:.2f} (CPU)")


if __name__ == "__main__":
    main()
