import os

import pyro
import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    """Every test that takes ``device`` runs on the CPU and, when present, on CUDA. The
    CUDA device carries its index, as tensors' ``.device`` does (``cuda:0 != cuda``)."""
    if request.param == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed_and_clear():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def pytest_configure(config):
    # Tests read the shared data folder the same way CI does.
    if "PYRO_EXT_DATA" not in os.environ:
        shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
        if os.path.isdir(shared):
            os.environ["PYRO_EXT_DATA"] = os.path.abspath(shared)


# The suite is many tiny tensor programs; intra-op threads only add contention on the
# 2-core CI machine (pytest-xdist already runs one worker per core).
torch.set_num_threads(1)
