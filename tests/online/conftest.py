"""Fixtures shared by the online filters' tests."""

import pytest
import torch


@pytest.fixture
def float64():
    """Run the test with float64 as torch's default dtype (exactness checks at 1e-10)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
