"""The deterministic goodwill recursion of thesis eq. (1.4) and the seasonal's matrices,
the numerics that :class:`~pyro_ext.models.bsts.RetailBSTS` builds its mean from."""

import math

import torch

__all__ = ["goodwill_offset"]

# goodwill_start="steady": the weeks of spend before the data, at the mean spend of the
# first (at most) START_WEEKS weeks of the data.
START_WEEKS = 52


def goodwill_offset(phi, inflow):
    r"""Deterministic goodwill ``D_t = phi D_{t-1} + inflow_{t-1}``, ``D_1 = 0``.

    :param phi: ``(...)`` AR coefficient ``1 - delta``.
    :param inflow: ``(..., T)`` ``sum_i q_i u_{i,t}`` at the lagged times, i.e. entry ``t``
        enters ``D_{t+1}``.
    :returns: ``(..., T)``; the linear filter ``D = k * inflow`` with kernel
        ``k_j = phi^j`` as one FFT convolution (``O(T log T)`` per draw and differentiable;
        a dense ``T x T`` lag matrix per particle cost ~15x more with its backward pass).
    """
    T = inflow.shape[-1]
    if T < 2:
        return torch.zeros_like(inflow * phi[..., None])
    j = torch.arange(T - 1, dtype=inflow.dtype, device=inflow.device)
    tiny = torch.finfo(inflow.dtype).tiny
    logphi = torch.log(
        torch.as_tensor(phi, dtype=inflow.dtype, device=inflow.device).clamp(min=tiny)
    )
    kernel = torch.exp(logphi[..., None] * j)  # phi^0 .. phi^{T-2}
    n = 2 * T  # no wrap-around
    conv = torch.fft.irfft(torch.fft.rfft(kernel, n) * torch.fft.rfft(inflow[..., :-1], n), n)
    conv = conv[..., : T - 1]
    zero = torch.zeros_like(conv[..., :1])
    return torch.cat([zero, conv], -1)


def _seasonal_matrices(period, harmonics, dtype, device=None):
    blocks, F = [], []
    for j in range(1, harmonics + 1):
        lam = 2 * math.pi * j / period
        c, s = math.cos(lam), math.sin(lam)
        blocks.append(torch.tensor([[c, s], [-s, c]], dtype=dtype, device=device))
        F += [1.0, 0.0]
    return torch.block_diag(*blocks), torch.tensor([F], dtype=dtype, device=device)
