import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pyro_ext.ops import is_traced


def _flag(x):
    return x + float(is_traced())


def test_eager_code_is_not_traced(device):
    assert not is_traced()
    assert _flag(torch.zeros((), device=device)).item() == 0.0


def test_every_kind_of_trace_is_seen():
    x = torch.zeros(2)
    assert torch.func.vmap(_flag)(x).tolist() == [1.0, 1.0]
    assert torch.func.grad(lambda x: _flag(x).sum())(x).tolist() == [1.0, 1.0]
    # make_fx keeps the flag as a constant of the graph: 1.0 added, whatever the input.
    assert "aten.add.Tensor(x_1, 1.0)" in make_fx(_flag)(x).code
    assert torch.compile(_flag, backend="eager", fullgraph=True)(x).tolist() == [1.0, 1.0]
