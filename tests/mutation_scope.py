"""Fixture scope that keeps mutation testing honest (see scripts/mutation.sh)."""

import os


def per_test_under_mutmut(fixture_name, config):
    """Module scope normally; per test under mutmut, which maps the functions a fixture calls
    only to the first test that requested it (so later tests would never run on a mutant)."""
    return "function" if os.environ.get("MUTANT_UNDER_TEST") else "module"
