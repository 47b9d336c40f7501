"""One torch thread for these tests, as the runtime's actors use: on a loaded 2-core machine two intra-op
threads make a tiny-model forward ~30x slower."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
