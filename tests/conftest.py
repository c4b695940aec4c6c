import os
import sys

import pyro
import pytest
import torch
from torch.overrides import TorchFunctionMode

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    """Every test that takes ``device`` runs on the CPU and, when present, on CUDA. The
    CUDA device carries its index, as tensors' ``.device`` does (``cuda:0 != cuda``)."""
    if request.param == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(request.param)


class _StrayTensorsOnMeta(TorchFunctionMode):
    """Inside it, a tensor that the package's own code makes by a factory call naming no
    device (``torch.zeros(3)``, ``torch.tensor(x)``, ``torch.as_tensor`` of a list) is made
    on the ``meta`` device. Calls from elsewhere (a test's model, Pyro, torch itself) are
    left alone: their tensors are theirs to place."""

    FACTORIES = frozenset(
        {
            torch.arange,
            torch.empty,
            torch.eye,
            torch.full,
            torch.linspace,
            torch.logspace,
            torch.ones,
            torch.rand,
            torch.randint,
            torch.randn,
            torch.scalar_tensor,
            torch.tensor,
            torch.zeros,
        }
    )

    PACKAGE = os.sep + "pyro_ext" + os.sep

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if (
            kwargs.get("device") is None
            and (
                func in self.FACTORIES or (func is torch.as_tensor and not torch.is_tensor(args[0]))
            )
            and self.PACKAGE in sys._getframe(1).f_code.co_filename
        ):
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


@pytest.fixture
def no_stray_tensors():
    """A context manager that finds, on a CPU-only machine, the tensors code would make on
    the CPU while its data live on CUDA: inside it a factory call without ``device=`` makes
    a ``meta`` tensor, and meta tensors do not mix with the CPU data (as CPU tensors do not
    with CUDA ones), nor give values (``.item()``). Make the data before entering it; code
    that means the host says ``device="cpu"``."""
    return _StrayTensorsOnMeta


@pytest.fixture(autouse=True)
def _seed_and_clear():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()
    # A test must not leave Pyro's validation off (the package's value checks follow it).
    assert pyro.distributions.is_validation_enabled(), "this test left validation off"
    # The first torch.compile of a process turns torch.distributions' default validation
    # off for good (TorchDynamo's patches); each test starts from Pyro's switch instead of
    # depending on whether a test before it compiled something.
    torch.distributions.Distribution.set_default_validate_args(True)


def pytest_configure(config):
    # Tests read the shared data folder the same way CI does.
    if "PYRO_EXT_DATA" not in os.environ:
        shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
        if os.path.isdir(shared):
            os.environ["PYRO_EXT_DATA"] = os.path.abspath(shared)


# The suite is many tiny tensor programs; intra-op threads only add contention on the
# 2-core CI machine (pytest-xdist already runs one worker per core).
torch.set_num_threads(1)
