"""A long task with its answer at the end: a running count tracked through many steps.

The ``chain`` family asks the model to keep a counter through ``n`` small changes ("add 3",
"take away 2"), writing one line per step and then ``Final answer: <value>``. The answer comes
only after a generation of about a dozen tokens per step, so a prompt of ``n`` changes makes
the model write a chain of ``n`` steps before it answers: under a decoding-time press, the
cache that holds the chain's early steps is compressed many times before the answer is written.
A worked example of three steps in the prompt fixes the format.

Built offline like the RULER-style families (:mod:`kvdrift.data.ruler_tasks`): everything is
drawn from the document's seed; the prompt's size unit is a step, so ``render(n)`` is the task
with ``n`` changes and :mod:`kvdrift.data.sizing` picks the largest ``n`` within the token
budget. The expected answer is the counter after those ``n`` changes (:meth:`ChainTask.answer`),
scored on the final answer only (:func:`kvdrift.data.scoring.final_answer`): a number written
anywhere else in the chain does not count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: The counter stays within [0, CHAIN_MAX]; each change is 1..CHAIN_STEP.
CHAIN_MAX = 99
CHAIN_STEP = 9

CHAIN_INTRO = (
    "Keep a running count. A counter starts at a number, then a list of changes is applied to "
    "it, one per line. Work through the changes in order: for each one, write a line with the "
    "step number, the change and the new value of the counter, as in the example. After the "
    'last step, write "Final answer:" followed by the final value of the counter.\n\n'
    "Example:\nStart: 4\n1. add 3\n2. take away 2\n3. add 5\nWorking:\n"
    "Step 1: 4 + 3 = 7\nStep 2: 7 - 2 = 5\nStep 3: 5 + 5 = 10\nFinal answer: 10"
)


@dataclass
class ChainTask:
    """One document's counter: its start and its changes, drawn as far as asked (the same
    changes for every ``n``, so a longer prompt extends a shorter one)."""

    rng: random.Random
    start: int = -1
    changes: list[int] = field(default_factory=list)
    values: list[int] = field(default_factory=list)  # the counter after each change

    def __post_init__(self) -> None:
        self.start = self.rng.randint(10, CHAIN_MAX - 10)

    def _extend(self, n: int) -> None:
        while len(self.changes) < n:
            value = self.values[-1] if self.values else self.start
            step = self.rng.randint(1, CHAIN_STEP)
            up = self.rng.random() < 0.5
            if value + step > CHAIN_MAX:
                up = False
            elif value - step < 0:
                up = True
            change = step if up else -step
            self.changes.append(change)
            self.values.append(value + change)

    def answer(self, n: int) -> int:
        """The counter after the first ``n`` changes."""
        self._extend(n)
        return self.values[n - 1] if n else self.start

    def render(self, n: int) -> str:
        """The prompt with ``n`` changes; it ends where the model starts working."""
        self._extend(n)
        lines = [f"{i}. {'add' if c > 0 else 'take away'} {abs(c)}"
                 for i, c in enumerate(self.changes[:n], start=1)]
        body = "\n".join([f"Start: {self.start}", *lines])
        return f"{CHAIN_INTRO}\n\nNow the task ({n} changes):\n{body}\nWorking:"

    def meta(self, n: int) -> dict[str, object]:
        """What a document records about its chain: its start, changes and running values."""
        self._extend(n)
        return {"start": self.start, "steps": n, "changes": self.changes[:n],
                "values": self.values[:n]}
