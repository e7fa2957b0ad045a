import pytest
import torch


@pytest.fixture
def restore_num_threads():
    """Tests may change torch's intra-op thread count; put it back afterwards."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)
