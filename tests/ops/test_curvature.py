import pytest
import torch

from pyro_ext.ops import hessian_diagonal


def quartic(x):
    return (x**4).sum() + x[..., 0].mul(x[..., -1]).sum() * 3 + torch.sin(x).prod(-1).sum()


@pytest.mark.parametrize("chunk_size", [1, 3, 256])
def test_hessian_diagonal_of_one_point_is_the_dense_hessians(device, chunk_size):
    x = torch.randn(5, dtype=torch.float64, device=device)
    expected = torch.func.hessian(quartic)(x).diagonal()
    torch.testing.assert_close(hessian_diagonal(quartic, x, chunk_size), expected)


def test_hessian_diagonal_of_separable_rows(device):
    points = torch.randn(4, 3, dtype=torch.float64, device=device)
    expected = torch.stack([torch.func.hessian(quartic)(p).diagonal() for p in points])
    torch.testing.assert_close(hessian_diagonal(quartic, points), expected)
