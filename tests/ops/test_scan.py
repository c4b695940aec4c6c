"""The parallel scans equal sequential folds, for products that do not commute."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyro_ext.ops import associative_scan, vector_reduce, vector_scan

# The device fixture is a plain value, the same for every example.
SCANS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def integer_matrices(n, seed, device, batch=()):
    """2x2 matrices with entries in {-1, 0, 1}: products of up to 40 of them stay integers
    below 2**53, so every association order gives the same floats and results compare
    exactly."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-1, 2, (n, *batch, 2, 2), generator=g).to(torch.float64)
    return x.to(device)


def mat_mat(a, b):
    return (a[0] @ b[0],)


def vec_mat(v, m):
    return ((v[0].unsqueeze(-2) @ m[0]).squeeze(-2),)


@SCANS
@given(n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_associative_scan_of_matrix_products_is_the_sequential_fold(device, n, seed):
    x = integer_matrices(n, seed, device, batch=(3,))
    expected = [x[0]]
    for i in range(1, n):
        expected.append(expected[-1] @ x[i])
    (actual,) = associative_scan(mat_mat, (x,))
    assert actual.device == x.device
    assert torch.equal(actual, torch.stack(expected))


def affine_then(a, b):
    """``x -> A x + c`` first, then ``b``'s map: a product with two tensors per element."""
    (A1, c1), (A2, c2) = a, b
    return A2 @ A1, (A2 @ c1.unsqueeze(-1)).squeeze(-1) + c2


@SCANS
@given(n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_associative_scan_of_tuples_composes_affine_maps_in_order(device, n, seed):
    A = integer_matrices(n, seed, device)
    c = integer_matrices(n, seed + 1, device)[..., 0]
    A_out, c_out = associative_scan(affine_then, (A, c))
    state = torch.zeros(2, dtype=A.dtype, device=device)
    for i in range(n):
        state = A[i] @ state + c[i]
        assert torch.equal(c_out[i], state)  # the maps applied to x = 0
    assert torch.equal(A_out[-1], torch.linalg.multi_dot(list(A.flip(0))) if n > 1 else A[0])


def test_associative_scan_of_nothing_is_nothing(device):
    x = torch.empty(0, 2, 2, device=device)
    (actual,) = associative_scan(mat_mat, (x,))
    assert actual.shape == (0, 2, 2)


@SCANS
@given(n=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_vector_scan_and_reduce_are_the_sequential_fold(device, n, seed):
    x = integer_matrices(n, seed, device, batch=(3,))
    v = torch.tensor([1.0, -1.0], dtype=torch.float64, device=device).expand(3, 2)
    expected = [v]
    for i in range(n):
        expected.append(expected[-1].unsqueeze(-2).matmul(x[i]).squeeze(-2))
    (prefixes,) = vector_scan((v,), (x,), vec_mat, mat_mat)
    assert torch.equal(prefixes, torch.stack(expected))
    (last,) = vector_reduce((v,), (x,), vec_mat, mat_mat)
    assert torch.equal(last, expected[-1])
