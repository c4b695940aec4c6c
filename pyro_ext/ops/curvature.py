"""Curvature of scalar functions of flat parameter vectors, by forward-over-reverse AD."""

from collections.abc import Callable

import torch

__all__ = ["hessian_diagonal"]


def hessian_diagonal(
    fn: Callable[[torch.Tensor], torch.Tensor], points: torch.Tensor, chunk_size: int = 256
) -> torch.Tensor:
    """
    The diagonal of the Hessian of the scalar ``fn`` at ``points`` ``(D,)``, or at each of
    ``points`` ``(S, D)`` when ``fn`` is a sum of one term per row (separable across
    rows, as a sum of per-draw losses): one Hessian-vector product with coordinate ``i``
    set in every row gives all ``S`` entries ``(i, i)``, so ``D`` products in all,
    vectorised ``chunk_size`` at a time. Exact; ``O(D)`` passes, for models of up to a
    few thousand parameters.
    """

    def hessian_column(direction):
        tangent = direction.expand_as(points)
        return torch.func.jvp(torch.func.grad(fn), (points,), (tangent,))[1]

    eye = torch.eye(points.shape[-1], dtype=points.dtype, device=points.device)
    columns = torch.func.vmap(hessian_column, chunk_size=chunk_size)(eye)  # (D, [S,] D)
    if points.dim() == 1:
        return columns.diagonal()
    return columns.diagonal(dim1=0, dim2=2)
