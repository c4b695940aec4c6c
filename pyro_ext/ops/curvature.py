"""Curvature of scalar functions of flat parameter vectors, by forward-over-reverse AD."""

from collections.abc import Callable

import torch

from .validation import check_int

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

    :raises TypeError: if ``fn`` is not callable or ``points`` not a floating-point tensor.
    :raises ValueError: if ``points`` is not ``(D,)`` or ``(S, D)`` with ``D >= 1``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable mapping points to a scalar, got {fn!r}")
    if not isinstance(points, torch.Tensor) or not points.is_floating_point():
        what = points.dtype if isinstance(points, torch.Tensor) else type(points).__name__
        raise TypeError(
            f"points must be a floating-point tensor (D,) or (S, D) (derivatives need a "
            f"real dtype), got {what}; convert it with points.to(torch.get_default_dtype())"
        )
    if points.dim() not in (1, 2) or points.shape[-1] < 1:
        raise ValueError(f"points must have shape (D,) or (S, D), got {tuple(points.shape)}")
    chunk_size = check_int(chunk_size, "chunk_size", low=1)

    def hessian_column(direction):
        tangent = direction.expand_as(points)
        return torch.func.jvp(torch.func.grad(fn), (points,), (tangent,))[1]

    eye = torch.eye(points.shape[-1], dtype=points.dtype, device=points.device)
    columns = torch.func.vmap(hessian_column, chunk_size=chunk_size)(eye)  # (D, [S,] D)
    if points.dim() == 1:
        return columns.diagonal()
    return columns.diagonal(dim1=0, dim2=2)
