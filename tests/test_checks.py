"""One message shape for argument checks: "<what> must be <rule>; got <value>"."""

import math

import numpy as np
import pytest

from kvdrift import checks
from tests.messages import whole


@pytest.mark.parametrize(("call", "message"), [
    (lambda: checks.integer(0, "replicates K", 1), "replicates K must be an integer >= 1; got 0"),
    (lambda: checks.integer(True, "seed"), "seed must be an integer; got True"),
    (lambda: checks.integer(2.0, "seed"), "seed must be an integer; got 2.0"),
    (lambda: checks.integer(9, "folds", 2, 8), "folds must be an integer within 2..8; got 9"),
    (lambda: checks.integer(-1, "x", hi=-2), "x must be an integer <= -2; got -1"),
    (lambda: checks.number(math.inf, "margin", 0, open_lo=True),
     "margin must be a finite number > 0; got inf"),
    (lambda: checks.number(math.nan, "t"), "t must be a finite number; got nan"),
    (lambda: checks.number(False, "t"), "t must be a finite number; got False"),
    (lambda: checks.number(1.0, "alpha", 0, 1, open_lo=True, open_hi=True),
     "alpha must be a number within (0, 1); got 1.0"),
    (lambda: checks.number(-0.5, "halfwidth", 0, open_lo=True),
     "halfwidth must be a finite number > 0; got -0.5"),
    (lambda: checks.number(0.0, "margin", 0, open_lo=True),
     "margin must be a finite number > 0; got 0.0"),
    (lambda: checks.number(-1.0, "t", 0), "t must be a finite number >= 0; got -1.0"),
    (lambda: checks.number(2.0, "t", hi=1), "t must be a finite number <= 1; got 2.0"),
    (lambda: checks.number(1.0, "t", hi=1, open_hi=True),
     "t must be a finite number < 1; got 1.0"),
    (lambda: checks.number(1.5, "p", 0, 1), "p must be a number within [0, 1]; got 1.5"),
    (lambda: checks.number(0.0, "p", 0, 1, open_lo=True),
     "p must be a number within (0, 1]; got 0.0"),
    (lambda: checks.depth(0, 3), "depth L must be an integer within 1..H = 1..3; got 0"),
    (lambda: checks.depth(4, 3), "depth L must be an integer within 1..H = 1..3; got 4"),
    (lambda: checks.within_horizon(True, "window", 3),
     "window must be an integer within 1..H = 1..3; got True"),
    (lambda: checks.within_horizon(2.0, "window", 3),
     "window must be an integer within 1..H = 1..3; got 2.0"),
    (lambda: checks.choice("gpu", "device", ("cpu", "cuda")),
     "device must be one of cpu, cuda; got 'gpu'"),
    (lambda: checks.choice(3, "kivi bits", (2, 4)), "kivi bits must be one of 2, 4; got 3"),
    (lambda: checks.choice(True, "level", (1, 2)), "level must be one of 1, 2; got True"),
    (lambda: checks.choice("x", "key", ("a", "b"), where="[study]"),
     "key in [study] must be one of a, b; got 'x'"),
    (lambda: checks.named_action("z", "target 'R(z)'", "the run", ["a", "b"]),
     "action in target 'R(z)' must be one of the actions of the run: a, b; got 'z'"),
    (lambda: checks.text("", "document id"), "document id must be a non-empty string; got ''"),
    (lambda: checks.text(None, "stratum"), "stratum must be a non-empty string; got None"),
    (lambda: checks.text(" \n", "prompt", visible=True),
     "prompt must be a string with visible text; got ' \\n'"),
    (lambda: checks.text(" ", "ray_address", visible=True, rule="'auto' or HOST:PORT"),
     "ray_address must be 'auto' or HOST:PORT; got ' '"),
    (lambda: checks.text(3, "name", rule="a model name"), "name must be a model name; got 3"),
    (lambda: checks.distinct_items([], "families"),
     "families must be one or more distinct values; got []"),
    (lambda: checks.distinct_items(("a", "b", "a"), "actions", "one or more distinct names"),
     "actions must be one or more distinct names; got ['a', 'b', 'a']"),
    (lambda: checks.alpha(0), "alpha must be within (0, 1); got 0"),
    (lambda: checks.alpha(1.0), "alpha must be within (0, 1); got 1.0"),
    (lambda: checks.alpha(float("nan")), "alpha must be within (0, 1); got nan"),
])
def test_refusals_name_the_value_and_what_is_allowed(call, message):
    with pytest.raises(ValueError, match=whole(message)):
        call()


def test_an_action_that_ran_comes_back():
    assert checks.named_action("b", "endpoint 'R(b)'", "model 'm'", iter(["a", "b"])) == "b"


def test_accepted_values_come_back_as_plain_python_numbers():
    assert type(checks.integer(np.int64(4), "K", 1)) is int
    assert checks.integer(np.int64(4), "K", 1) == 4
    assert checks.number(np.float32(0.5), "a", 0, 1) == 0.5
    assert checks.number(3, "t", 0) == 3.0 and type(checks.number(3, "t")) is float
    assert checks.number(0.0, "t", 0) == 0.0  # closed bounds by default
    assert checks.number(1.0, "p", 0, 1) == 1.0 and checks.number(1.0, "t", hi=1) == 1.0
    assert checks.integer(8, "folds", 2, 8) == 8 and checks.depth(3, 3) == 3
    assert checks.within_horizon(np.int64(1), "window", 3) == 1
    assert checks.choice("cpu", "device", ("cpu", "cuda")) == "cpu"
    assert checks.choice(4, "kivi bits", (2, 4)) == 4
    assert checks.distinct_items(iter(["a", "b"]), "actions") == ("a", "b")
    assert checks.text(" ", "document id") == " "  # non-empty is enough unless visible
    assert checks.text(" a ", "prompt", visible=True) == " a "
    assert checks.alpha(0.05) == 0.05
