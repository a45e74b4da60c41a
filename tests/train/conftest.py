"""Fixtures shared by the trainer tests."""

from __future__ import annotations

import pytest
import torch

from honing.models import build_tiny_random


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The model is tiny: intra-op threads only add synchronisation on a busy 2-core box."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny(_one_thread):  # noqa: ANN001
    """(model, tokenizer): the in-code tiny random model, seed 0."""
    return build_tiny_random(seed=0)
