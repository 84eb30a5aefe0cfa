"""Fixtures shared by the planner's tests."""

import pytest

from causal_lm import micro_model_and_batches


@pytest.fixture(scope="module")
def model_and_batches():
    """The sharpness tests' micro causal LM and two held-out batches (fresh per test module)."""
    return micro_model_and_batches()
