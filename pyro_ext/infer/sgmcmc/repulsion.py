"""Particle interactions of the repulsive samplers (thesis section 2.3).

With ``L`` particles stacked as ``z`` of shape ``(L, D)``, the diffusion matrix of SGLD+R
(eq. 2.7) is ``D_K = K (x) I_D / L`` with the ``L x L`` kernel matrix ``K``, and its
correction term is the divergence ``Gamma_i = sum_j grad_{z_j} K_ij / L`` of eq. (2.5). A
:class:`Coupling` holds both; it is all the update functions need, so memory stays
``O(L^2 + L D)`` for the built-in RBF kernel.

For a kernel of fixed bandwidth ``Gamma`` is the SVGD repulsion ``sum_j grad_{z_j} k(z_j,
z_i) / L``. The median-heuristic bandwidth ``h(z)`` depends on the particles, and then
``K_ij = exp(-|z_i - z_j|^2 / h(z))`` changes with ``z_j`` through ``h`` as well: the
divergence gains ``sum_j K_ij |z_i - z_j|^2 / h^2 grad_{z_j} h / L``. Without that term the
chain's stationary law is not the target (on a 1-D N(0, 1) with ten particles the variance
comes out 6-8 % low at every step size); SVGD, an optimiser whose fixed point is a Stein
identity for the kernel in use, holds ``h`` constant, and so do the noise-free samplers here.
"""

import math

import torch
from pyro.infer.svgd import SteinKernel

from ...ops.validation import check_positive


class Coupling:
    """
    :ivar torch.Tensor matrix: the ``(L, L)`` kernel matrix ``K_ij = k(z_i, z_j)``.
    :ivar torch.Tensor repulsion: the ``(L, D)`` term ``sum_j grad_{z_j} k(z_j, z_i)``;
        computed on first read when the coupling was built from a :attr:`shift` (the
        samplers' drift does not read it then, which saves three passes over ``(L, D)``
        tensors per step).
    :ivar int cholesky_tries: how many jitters :func:`coupled_noise` tries (each ten
        times the last) before giving up. A traced step uses 1, which has no
        data-dependent branch: a failed factorisation then gives non-finite noise, and
        the caller redoes the step eagerly with every try.
    :ivar shift: ``None``, or an ``(L, D)`` tensor ``s`` with ``repulsion = rowsum(K) * s -
        K @ s + bandwidth_term`` (a translation-invariant kernel such as the RBF one, where
        ``s = 2 z / h``). The drift ``K @ grad + repulsion`` is then ``K @ (grad - s) +
        rowsum(K) * s + bandwidth_term``: one ``L x L x D`` product instead of two.
    :ivar bandwidth_term: ``None``, or the ``(L, D)`` part ``sum_j dK_ij/dh grad_{z_j} h`` of
        the repulsion that comes from a bandwidth ``h(z)`` computed from the particles (see
        the module docstring); only read together with :attr:`shift`.
    """

    __slots__ = ("matrix", "_repulsion", "cholesky_tries", "shift", "bandwidth_term")

    def __init__(self, matrix, repulsion=None, cholesky_tries=6, shift=None, bandwidth_term=None):
        if repulsion is None and shift is None:
            raise ValueError("a Coupling needs its repulsion term, or the shift that gives it")
        self.matrix = matrix
        self._repulsion = repulsion
        self.cholesky_tries = cholesky_tries
        self.shift = shift
        self.bandwidth_term = bandwidth_term

    @property
    def repulsion(self) -> torch.Tensor:
        if self._repulsion is None:
            matrix, shift = self.matrix, self.shift
            self._repulsion = matrix.sum(-1, keepdim=True) * shift - matrix @ shift
            if self.bandwidth_term is not None:
                self._repulsion = self._repulsion + self.bandwidth_term
        return self._repulsion

    def drift(self, grad: torch.Tensor) -> torch.Tensor:
        """The drift ``(K grad + repulsion) / L`` of eq. (2.5) at the gradients ``grad``
        ``(L, D)`` of the particles."""
        if self.shift is not None:
            shift = self.shift
            return shifted_drift(self.matrix, shift, shift, grad, self.bandwidth_term)
        return (self.matrix @ grad + self.repulsion) / grad.shape[0]

    def couple(self, velocity: torch.Tensor) -> torch.Tensor:
        """``K velocity / L``: the momentum samplers' coupled position update."""
        return self.matrix @ velocity / velocity.shape[0]

    def correlate(self, noise: torch.Tensor) -> torch.Tensor:
        """Standard normal ``noise`` ``(L, D)`` mapped to ``N(0, K (x) I_D / L)``."""
        return coupled_noise(self, noise)

    def _replace(self, **changes):
        """A copy with some fields changed, as a ``NamedTuple``'s ``_replace``."""
        fields = {
            "matrix": self.matrix,
            "repulsion": self._repulsion,
            "cholesky_tries": self.cholesky_tries,
            "shift": self.shift,
            "bandwidth_term": self.bandwidth_term,
        }
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"Coupling has no fields {sorted(unknown)}")
        if changes.get("shift", self.shift) is None and "repulsion" not in changes:
            fields["repulsion"] = self.repulsion  # no shift left to compute it from
            fields["bandwidth_term"] = None  # part of that repulsion
        fields.update(changes)
        return Coupling(**fields)


def shifted_drift(matrix, shift_rows, shift, grad, bandwidth_term=None):
    """
    Rows of the drift ``(K (grad - s) + rowsum(K) s + bandwidth term) / L`` from those rows
    of the kernel matrix ``matrix`` ``(n, L)``, of the shift ``shift_rows`` ``(n, D)`` and of
    the bandwidth term, and every particle's ``shift`` and ``grad`` ``(L, D)``: one product
    by ``K`` (see :attr:`Coupling.shift`); the ``1 / L`` scales the small factors, and addmm
    adds in place of a separate pass.
    """
    num_particles = grad.shape[0]
    scaled = matrix / num_particles
    offset = scaled.sum(-1, keepdim=True) * shift_rows
    if bandwidth_term is not None:
        offset = offset + bandwidth_term / num_particles
    return torch.addmm(offset, scaled, grad - shift)


class RBFKernel(SteinKernel):
    r"""
    Isotropic RBF kernel :math:`k(z, z') = \exp(-\|z - z'\|^2 / h)` of thesis eq. (2.4).

    The bandwidth ``h`` defaults to the median heuristic ``median_{i<j} \|z_i - z_j\|^2 /
    \log(L + 1)`` (the choice of :class:`pyro.infer.RBFSteinKernel`, but over whole
    particles rather than per dimension), recomputed at every step.

    With the median bandwidth the diffusion matrix ``K(z) / L`` of eq. (2.7) depends on the
    particles through ``h(z)`` too, so :meth:`coupling` adds that dependence to the
    divergence term (``bandwidth_gradient=True``): the median is one pair's squared
    distance ``|z_a - z_b|^2``, so ``grad_{z_a} h = -grad_{z_b} h = 2 (z_a - z_b) / log(L + 1)``
    and the extra term is a rank-one ``(L, D)`` tensor, ``O(L D)`` on top of the kernel
    matrix. The noisy samplers need it to keep their stationary law; the noise-free ones
    (SVGD) hold ``h`` constant, as :class:`pyro.infer.SVGD` does. A fixed ``bandwidth``
    has no such term and costs the same, but no single value suits both the start and the
    posterior: too small and the particles decouple, too large and every particle moves
    with the ensemble's mean.

    It is also a :class:`pyro.infer.svgd.SteinKernel`, so the same kernel can drive
    :class:`pyro.infer.SVGD` in ``mode="multivariate"``.

    :param float bandwidth: a fixed bandwidth ``h > 0``; ``None`` for the median heuristic.

    >>> import torch
    >>> coupling = RBFKernel(bandwidth=1.0).coupling(torch.tensor([[0.0], [1.0]]))
    >>> coupling.matrix
    tensor([[1.0000, 0.3679],
            [0.3679, 1.0000]])
    >>> coupling.repulsion  # sum_j grad_{z_j} k(z_j, z_i): the particles push apart
    tensor([[-0.7358],
            [ 0.7358]])
    """

    def __init__(self, bandwidth=None):
        self.bandwidth = check_positive(bandwidth, "bandwidth", allow_none=True)

    def _squared_distances(self, z):
        sq_norms = torch.linalg.vector_norm(z, dim=-1).square()  # no (L, D) temporary
        sq = (sq_norms.unsqueeze(-1) + sq_norms.unsqueeze(-2) - 2.0 * z @ z.T).clamp_min(0.0)
        # Zero the diagonal out of place (round-off leaves it slightly off), which vmap
        # batches: the calibration benchmark runs many ensembles at once.
        eye = torch.eye(sq.shape[-1], dtype=torch.bool, device=sq.device)
        return sq.masked_fill(eye, 0.0)

    def squared_distance_rows(self, z: torch.Tensor, rows: slice) -> torch.Tensor:
        """Rows ``rows`` of the squared distances of :meth:`_squared_distances`, ``(|rows|,
        L)``, in ``O(|rows| L D)``: a rank's share of the kernel matrix (the rest of the
        whole matrix is ``O(L^2)`` once the ranks' rows are gathered)."""
        sq_norms = torch.linalg.vector_norm(z, dim=-1).square()
        block = z[rows]
        sq = (sq_norms[rows].unsqueeze(-1) + sq_norms.unsqueeze(-2) - 2.0 * block @ z.T).clamp_min(
            0.0
        )
        own = torch.arange(rows.start, rows.stop, device=z.device)
        diagonal = own.unsqueeze(-1) == torch.arange(z.shape[0], device=z.device)
        return sq.masked_fill(diagonal, 0.0)

    def bandwidth_and_pair(self, sq: torch.Tensor):
        """The bandwidth ``h`` at squared distances ``sq`` ``(L, L)`` and, for the median
        heuristic, the pair ``(a, b)`` whose distance it is (``None, None`` for a fixed
        bandwidth)."""
        if self.bandwidth is not None:
            return self._bandwidth(sq), None, None
        return self._median_pair(sq)

    def bandwidth_term(self, matrix_rows, sq_rows, h, a, b, z) -> torch.Tensor:
        """
        Rows of the repulsion's bandwidth term ``sum_j dK_ij/dh grad_{z_j} h`` (see
        :meth:`coupling`) from the same rows of the kernel matrix and squared distances
        ``(n, L)``, the median pair ``(a, b)`` and all the particles ``z`` ``(L, D)``.
        """
        # dK_ij/dh = K_ij |z_i - z_j|^2 / h^2, and only z_a and z_b move h, in opposite
        # directions, so the term is rank one. (Where h fell back to 1, z_a = z_b and the
        # direction below vanishes, as it should: h is constant there.) index_select with
        # the pair as a tensor reads nothing on the host, so the step traces.
        pair = torch.stack([a, b])  # (2,)
        weight = (matrix_rows * sq_rows / h.square()).index_select(1, pair)  # (n, 2)
        moved = weight[:, :1] - weight[:, 1:]
        ends = z.index_select(0, pair)
        direction = (2.0 / math.log(z.shape[0] + 1)) * (ends[:1] - ends[1:])  # (1, D)
        return moved * direction

    def _median_pair(self, sq):
        """The median heuristic's bandwidth and the pair ``(a, b)`` whose distance it is."""
        num_particles = sq.shape[0]
        rows, cols = torch.triu_indices(num_particles, num_particles, offset=1, device=sq.device)
        # torch.median takes the lower middle value of an even count: one pair's distance.
        median, index = sq[rows, cols].median(dim=0)
        h = median / math.log(num_particles + 1)
        # Coincident particles give h = 0; any positive h then gives the same (flat) kernel.
        # index_select (not rows[index]) reads no 0-dim index on the host, so this traces.
        index = index.reshape(1)
        pair_rows, pair_cols = rows.index_select(0, index), cols.index_select(0, index)
        return torch.where(h > 0, h, torch.ones_like(h)), pair_rows[0], pair_cols[0]

    def _bandwidth(self, sq):
        if self.bandwidth is not None:
            return torch.as_tensor(self.bandwidth, dtype=sq.dtype, device=sq.device)
        return self._median_pair(sq)[0]

    def gram(self, z: torch.Tensor):
        """
        The ``(L, L)`` Gram matrix ``K_ij = k(z_i, z_j)`` and the bandwidth ``h`` used.
        Differentiable in ``z``; the median bandwidth is treated as a constant, as in SVGD.
        """
        sq = self._squared_distances(z)
        h = self._bandwidth(sq.detach())
        return torch.exp(-sq / h), h

    def coupling(self, z: torch.Tensor, bandwidth_gradient: bool = True) -> Coupling:
        """
        The :class:`Coupling` at particles ``z`` ``(L, D)`` in ``O(L^2 + L D)`` memory,
        differentiable in ``z`` (VIS backpropagates through it).

        :param bool bandwidth_gradient: include the median bandwidth's dependence on the
            particles in the repulsion (the exact divergence of eq. 2.5); ``False`` holds
            ``h`` constant, as SVGD does. Without effect for a fixed ``bandwidth``.
        """
        sq = self._squared_distances(z)
        bandwidth_term = None
        h, a, b = self.bandwidth_and_pair(sq.detach())
        matrix = torch.exp(-sq / h)
        if self.bandwidth is None and bandwidth_gradient:
            bandwidth_term = self.bandwidth_term(matrix, sq, h, a, b, z)
        # sum_j k_ij (2/h)(z_i - z_j) = rowsum(K) s - K s with s = 2 z / h, without forming
        # the (L, L, D) differences; read (and computed) only when asked for.
        return Coupling(matrix, shift=(2.0 / h) * z, bandwidth_term=bandwidth_term)

    @torch.no_grad()
    def log_kernel_and_grad(self, particles):
        sq = self._squared_distances(particles)
        h = self._bandwidth(sq)
        delta = particles.unsqueeze(0) - particles.unsqueeze(1)
        return (-sq / h).unsqueeze(-1), 2.0 * delta / h


def stein_coupling(
    kernel: SteinKernel, z: torch.Tensor, bandwidth_gradient: bool = True
) -> Coupling:
    """
    The :class:`Coupling` of any :class:`pyro.infer.svgd.SteinKernel`, read the way
    :class:`pyro.infer.SVGD` reads it in ``mode="multivariate"``.

    Kernels other than :class:`RBFKernel` return ``(L, L, D)`` tensors, so they cost
    ``O(L^2 D)`` memory, and their bandwidth is held constant within a step.

    :param bool bandwidth_gradient: for :class:`RBFKernel`, whether the repulsion carries
        the median bandwidth's dependence on the particles (see
        :meth:`RBFKernel.coupling`): ``True`` for the noisy samplers, ``False`` for SVGD.
    """
    if isinstance(kernel, RBFKernel):
        return kernel.coupling(z, bandwidth_gradient)
    with torch.no_grad():
        log_kernel, kernel_grad = kernel.log_kernel_and_grad(z)
        matrix = log_kernel.sum(-1).exp()
        repulsion = -torch.einsum("nm,nm...->n...", matrix, kernel_grad)
    return Coupling(matrix, repulsion)


def noise_factor(matrix: torch.Tensor, cholesky_tries: int = 6) -> torch.Tensor:
    """
    The lower Cholesky factor of the kernel matrix ``K`` ``(L, L)`` plus the smallest
    jitter that factorises, of ``cholesky_tries`` (each ten times the last); NaN where a
    traced factorisation (one try) failed, or the particles overflowed, so that the update
    turns non-finite and the kernel reports a divergence at this step.
    """
    num_particles = matrix.shape[0]
    eye = torch.eye(num_particles, dtype=matrix.dtype, device=matrix.device)
    # The RBF Gram matrix is positive semi-definite but often numerically singular.
    jitter = 1e-6 if matrix.dtype == torch.float64 else 1e-4
    for _ in range(cholesky_tries):
        chol, info = torch.linalg.cholesky_ex(matrix + jitter * eye)
        if cholesky_tries == 1:
            # Traced: no branch on the result; a failure turns the update non-finite.
            return torch.where(info == 0, chol, math.nan)
        if not info.any():
            return chol
        jitter *= 10.0
    if not torch.isfinite(matrix).all():
        return torch.full_like(matrix, math.nan)
    raise RuntimeError("the particle kernel matrix is not positive semi-definite")


def coupled_noise(coupling: Coupling, noise: torch.Tensor) -> torch.Tensor:
    """
    Map standard normal ``noise`` ``(L, D)`` to ``N(0, K (x) I_D / L)``, the noise
    covariance of eq. (2.7) up to the factor ``2 eps``.
    """
    chol = noise_factor(coupling.matrix, coupling.cholesky_tries)
    return chol @ noise / math.sqrt(coupling.matrix.shape[0])
