"""One divergence-time convention: estimators, records and analysis helpers agree on NEVER."""

import numpy as np
import torch

from kvdrift.divergence import NEVER, diverged, divergence_time, first_true
from kvdrift.estimate.rollout import first_mismatch
from kvdrift.records.terms import trajectory_terms, window_terms

MISMATCH = np.array([[0, 0, 0, 0],   # never
                     [1, 0, 0, 0],   # tau = 1
                     [0, 0, 1, 1],   # tau = 3
                     [0, 0, 0, 1]],  # tau = H
                    dtype=bool)


def test_never_is_zero_and_taus_are_one_based():
    assert NEVER == 0
    np.testing.assert_array_equal(divergence_time(MISMATCH), [0, 1, 3, 4])
    np.testing.assert_array_equal(diverged(divergence_time(MISMATCH)), [False, True, True, True])
    np.testing.assert_array_equal(first_true(MISMATCH, 9), [9, 1, 3, 4])


def test_tau_is_taken_along_the_last_axis_of_any_rank():
    # [documents, replicates, H] = [2, 4, 4], as the analysis reads EOS and mismatch flags
    cube = np.stack([MISMATCH, MISMATCH[::-1]])
    np.testing.assert_array_equal(divergence_time(cube), [[0, 1, 3, 4], [4, 3, 1, 0]])
    np.testing.assert_array_equal(first_true(cube[:, :3], 9), [[9, 1, 3], [4, 3, 1]])


def test_estimator_and_analysis_give_the_same_tau():
    np.testing.assert_array_equal(first_mismatch(torch.from_numpy(MISMATCH)).numpy(),
                                  divergence_time(MISMATCH))


def test_never_diverged_rows_carry_no_occurrence_exposure_or_capacity():
    H = MISMATCH.shape[1]
    terms = trajectory_terms(MISMATCH)
    np.testing.assert_array_equal(terms.occurrence * H, [0, 1, 1, 1])
    np.testing.assert_array_equal(terms.exposure * H, [0, 3, 1, 0])  # (H - tau) for diverged
    np.testing.assert_array_equal(terms.occupation * H, [0, 0, 1, 0])
    w = window_terms(MISMATCH, 2)
    np.testing.assert_array_equal(w.observed * H, [0, 1, 2, 1])
    np.testing.assert_array_equal(w.capacity * H, [0, 2, 0, 0])  # (H - tau - L + 1)_+
