r"""
The default step size of the stochastic-gradient kernels: the largest step whose
stationary bias, on the posterior's local Gaussian approximation, stays within a stated
tolerance.

A stochastic-gradient sampler has no accept/reject step, so its step size sets its bias:
on a Gaussian target with curvature :math:`\lambda` (an eigenvalue of the potential's
Hessian :math:`H`) and minibatch-gradient noise of variance :math:`s^2` along the same
direction, SGLD with step :math:`\epsilon` has stationary variance

.. math:: \mathrm{Var}_\epsilon = \frac1\lambda\,\frac{1 + \epsilon s^2/2}{1 - \epsilon\lambda/2}

instead of :math:`1/\lambda`; SGHMC (and AdamSGLD in its preconditioned coordinates) is
the same linear recursion with momentum, whose stationary covariance solves a 2x2
discrete Lyapunov equation (:func:`stationary_variance_error`). The relative error grows
with :math:`\epsilon\lambda` and :math:`\epsilon s^2`, so bounding it in the stiffest
direction bounds it in every direction. :func:`bias_bounded_step_size` inverts it: the
largest step whose error, at the largest curvature and the largest gradient-noise
variance, is ``tolerance``.

:class:`StepSizeAdaptation` estimates those two numbers during warm-up, per particle, by
power iteration: Hessian-vector products of the minibatch potential (each an unbiased
estimate of :math:`Hv`) for the curvature, and differences of two independent minibatch
gradients at the same particles (covariance :math:`2C`) for the noise. With repulsion the
drift and the noise pass through the kernel matrix :math:`K / L` (once for SGLD+R, twice
for the momentum samplers, whose velocity is coupled on the way in and on the way out:
``p`` times). Held fixed, :math:`K / L = U\,\mathrm{diag}(\mu)\,U^\top` splits the
ensemble into particle modes, mode :math:`k` moving with the step :math:`\epsilon\mu_k^p`,
and the variance of the draws pooled over the particles is the mean over the modes. So the
bias bound divides the step by the mean :math:`\overline{\mu^p} = \mathrm{tr}((K/L)^p)/L`
(``1 / L`` for SGLD+R) and scales the minibatch noise by its share
:math:`\mathrm{tr}((K/L)^p C_L)/\mathrm{tr}(C_L)`, with :math:`C_L` the particles'
noise covariance (the minibatch is shared, so their noises correlate and load the mean
mode); the largest :math:`\mu^p` (the ensemble's mean mode) only bounds stability. Each
particle then moves per step as a plain chain at its own default step does (SGLD+R,
SGHMC+R: the tests). The step is
re-estimated during warm-up, follows the particles to the posterior, and is frozen when
warm-up ends, so the chain that is kept is a time-homogeneous sampler. Out of a start the
curvature can grow a hundredfold within tens of steps (a BNN's noise precision, and with it
every weight's curvature, from 1 at the start to about 100 at the posterior), so in warm-up's
first half the estimates come at steps 1, 3, 7, 15, ... (the interval doubling up to
``every``), at the next step again whenever an estimate exceeds the running one by half
(:data:`CURVATURE_GROWTH`), and the step is stable at the curvature measured last, not at
a lagging average: a step ten steps stale blew SGHMC's particles on the UCI yacht data out
to a noise precision near 0 in 6 of 20 splits. In the second half an estimate comes every
``every`` steps and all of them are averaged equally.

What it costs: each estimate is one gradient with its Hessian-vector product and one more
gradient (about four gradient evaluations), every ``every`` warm-up steps (a few more
while the curvature grows); nothing after warm-up. What it does not do: make an
ill-conditioned posterior mix fast. The flattest direction relaxes in about
:math:`\kappa / (2\,\mathrm{tolerance})` steps, with
:math:`\kappa` the condition number of :math:`H + C`; a preconditioned kernel
(:class:`~pyro_ext.infer.AdamSGLD`) or more steps are the remedy. It says so: each
estimate also probes the mean curvature :math:`\mathrm{tr}(H) / D` (Hutchinson's
estimator, Rademacher signs, one more Hessian-vector product), from which
:meth:`StepSizeAdaptation.relaxation_steps` gives a lower bound on how many steps a typical
direction takes to relax, and :class:`~pyro_ext.infer.MCMC` warns
(:class:`~pyro_ext.infer.SlowMixingWarning`) when a run keeps fewer than
:data:`MIXING_RELAXATIONS` (100) times as many: ten relaxations leave a split-R-hat near
1.3.
In :data:`SPECTRUM_MAX_DIM` dimensions or fewer the mean says little about a typical
direction (one stiff noise scale among six parameters of a mixture makes the mean a sixth
of the largest curvature while the locations' curvature is hundreds of times smaller), so
there each estimate computes the whole Hessian (``D`` more Hessian-vector products, no
random draws) and the bound uses its median eigenvalue instead.
On a UCI BNN this bound is about 10 000 steps at the stiffest direction's step (the
minibatch noise and a few data-pinned weights make that direction thousands of times
stiffer than the mean), and on a 784-1000-1000-1000-10 MNIST network 3e7 to 2e8 steps:
with the bias bounded in every direction, the draws of a run of usual length have not left
their start.

Where the bias is bounded is therefore a choice (``bound``, the kernels' ``bias_bound``).
``"stiffest"`` bounds it in every direction. ``"typical"`` bounds its mean over directions
instead, the error at the mean curvature :math:`\mathrm{tr}(H)/D` and the mean noise
variance :math:`\mathrm{tr}(C)/D` (to first order in the step the error is linear in both,
so this is the mean of the directions' errors), with the stiffest direction kept stable
(its error from the curvature alone at most ``stability_tolerance``): the stiff directions'
variance is then inflated more, the typical ones' is right. ``"auto"``, the kernels'
default, takes ``"stiffest"``'s step when a typical direction relaxes 100 times within the
steps the run keeps, else the smallest larger step at which it does, up to
``"typical"``'s: the least biased step whose draws mix, which a run too short to mix at any
of them is warned about. On well-conditioned posteriors (the calibration suite, the
README's logistic regression) the three agree.
"""

import math

import pyro
import torch

from .repulsion import stein_coupling

__all__ = ["StepSizeAdaptation", "bias_bounded_step_size", "stationary_variance_error"]

#: up to this many dimensions, :meth:`StepSizeAdaptation.relaxation_steps` reads the median
#: eigenvalue of the whole Hessian (``D`` Hessian-vector products per estimate), above it
#: Hutchinson's mean curvature
SPECTRUM_MAX_DIM = 32

#: how many relaxation times of a typical direction the kept steps must span for their draws
#: to have mixed: about 50 effective draws per particle (a relaxation time ``T`` is an
#: integrated autocorrelation time of ``2 T``), at which the split-R-hat over ten particles
#: of a Gaussian AR(1) chain started at stationarity is about 1.03 (p90 1.04, max over
#: five coordinates; ten relaxations give 1.3, as SGLD's 1.39 on the breast-cancer
#: regression did). ``"auto"`` raises the step until a typical direction relaxes this often
#: and :class:`~pyro_ext.infer.MCMC` warns where it cannot.
MIXING_RELAXATIONS = 100

#: in warm-up's first half, a curvature estimate this many times the running one means the
#: particles are moving into a stiffer region: the next estimate comes at the next step
CURVATURE_GROWTH = 1.5

#: what :meth:`StepSizeAdaptation.bounded_step_size` bounds the bias in
BIAS_BOUNDS = ("auto", "stiffest", "typical")


def stationary_variance_error(
    step_size: float, curvature: float, noise_variance: float = 0.0, friction: float = 1.0
) -> float:
    r"""
    Relative error ``lambda * Var - 1`` of the stationary variance of the linear recursion

    .. code-block:: text

        v <- (1 - friction) v - step_size (curvature z + zeta) + sqrt(2 friction step_size) xi
        z <- z + v,        zeta ~ N(0, noise_variance),  xi ~ N(0, 1)

    which is SGLD for ``friction = 1`` and SGHMC (in the package's SGD-with-momentum form,
    :func:`~pyro_ext.infer.sgmcmc.updates.sghmc_update`) otherwise, on a Gaussian target of
    precision ``curvature`` with minibatch-gradient noise of variance ``noise_variance``.
    ``inf`` where the recursion is unstable.
    """
    h, lam, a = float(step_size), float(curvature), float(friction)
    if h <= 0:
        return 0.0
    # A 2 x 2 system of host numbers: solved on the CPU whatever device the chain is on.
    host = dict(dtype=torch.float64, device="cpu")
    transition = torch.tensor([[1.0 - h * lam, 1.0 - a], [-h * lam, 1.0 - a]], **host)
    if torch.linalg.eigvals(transition).abs().max() >= 1.0:
        return math.inf
    # Sigma = A Sigma A^T + q b b^T with b = (1, 1): the state (z, v) gets the same noise.
    q = 2.0 * a * h + h * h * float(noise_variance)
    system = torch.eye(4, **host) - torch.kron(transition, transition)
    sigma = torch.linalg.solve(system, torch.full((4,), q, **host))
    return lam * float(sigma[0]) - 1.0


def bias_bounded_step_size(
    curvature: float,
    noise_variance: float = 0.0,
    friction: float = 1.0,
    tolerance: float = 0.05,
) -> float:
    """
    The largest step size whose :func:`stationary_variance_error` at ``curvature`` and
    ``noise_variance`` is at most ``tolerance`` (bisection in log step size; the error
    grows with the step over the stable range).
    """
    lam, noise = abs(float(curvature)), max(float(noise_variance), 0.0)
    if not (math.isfinite(lam) and math.isfinite(noise)):
        raise ValueError(
            f"the curvature ({curvature}) and noise ({noise_variance}) estimates of the "
            "step-size adaptation must be finite: the model's log density has a non-finite "
            "gradient or Hessian at the particles' values"
        )
    scale = lam + noise
    if scale <= 0:
        raise ValueError(
            "the potential has no curvature and no gradient noise at the particles, so no "
            "step size bounds the bias there: pass step_size explicitly"
        )
    low, high = 1e-8 / scale, 4.0 / scale
    for _ in range(60):
        middle = math.sqrt(low * high)
        if stationary_variance_error(middle, lam, noise, friction) <= tolerance:
            low = middle
        else:
            high = middle
        if high / low < 1.001:
            break
    return low


def _unit(vectors: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    norms = vectors.norm(dim=-1, keepdim=True)
    return torch.where(norms > 0, vectors / norms.clamp_min(1e-300), fallback)


class StepSizeAdaptation:
    """
    The warm-up rule behind ``step_size=None`` (see the module docstring).

    :param float tolerance: the largest relative error of the stationary variance, in the
        stiffest direction of the local Gaussian approximation, that the step may cause.
    :param float friction: the sampler's friction (``1`` for SGLD, ``friction`` for SGHMC,
        ``1 - beta1`` for AdamSGLD).
    :param int coupling_power: how often the velocity passes through the repulsion's
        ``K / L`` (1 for SGLD+R, 2 for the momentum samplers).
    :param int every: warm-up steps between two estimates, at most (fewer in the first half
        while the curvature grows: :attr:`interval`).
    :param int initial_iterations: power iterations at the starting particles.
    :param float smoothing: weight of the past in the running estimates.
    :param float early_tolerance: the tolerance of :attr:`early_step_size`, the step of the
        first half of warm-up. Warm-up draws are discarded, so their bias does not matter: a
        variance error of 1 brings the particles from their start several times faster than
        ``tolerance``; the second half, at ``tolerance``, lets them settle into the
        stationary law that is kept.
    :param str bound: where the bias is bounded: ``"stiffest"``, ``"typical"`` or
        ``"auto"`` (see :meth:`bounded_step_size`).
    :param int kept_steps: the steps the run keeps after warm-up (``"auto"`` lets a
        typical direction relax :data:`MIXING_RELAXATIONS` times within them).
    :param float stability_tolerance: the early step is also at most the step whose error
        from the curvature alone (no minibatch noise) is this: 0.3 puts SGLD's step at about
        ``0.46 / lambda``, a factor of 4 inside the stable range ``2 / lambda``, so the
        curvature may grow fourfold between two estimates, as it does while a noise scale
        falls from its start or AdamSGLD's preconditioner adapts. (With the curvature at a
        variance error of 1, a factor of 2, ``Gibbs(AdamSGLD(gmm))`` diverged in its first
        warm-up half on the mixture of ``benchmarks/gibbs.py --mixture``.) The minibatch
        noise inflates the variance but cannot make the recursion unstable, so where it
        dominates the early step stays at ``early_tolerance``. ``"typical"`` (and ``"auto"``)
        never raise the step beyond this either.
    """

    def __init__(
        self,
        tolerance=0.05,
        friction=1.0,
        coupling_power=1,
        every=10,
        initial_iterations=20,
        smoothing=0.8,
        early_tolerance=1.0,
        stability_tolerance=0.3,
        bound="stiffest",
        kept_steps=None,
    ):
        if bound not in BIAS_BOUNDS:
            raise ValueError(f"bound must be one of {BIAS_BOUNDS}, got {bound!r}")
        self.tolerance = tolerance
        self.bound = bound
        self.kept_steps = kept_steps
        self.friction = friction
        self.coupling_power = coupling_power
        self.every = every
        #: steps from this estimate to the next: 1 after the start and while the curvature
        #: grows, doubling up to ``every`` while it does not (``every`` in the second half)
        self.interval = 1
        #: the warm-up step of the next estimate (set by the kernel)
        self.next_estimate = None
        self.initial_iterations = initial_iterations
        self.smoothing = smoothing
        self.early_tolerance = early_tolerance
        self.stability_tolerance = stability_tolerance
        self.curvature_direction = None
        self.noise_direction = None
        self.noise_moment = None
        self.curvature = None
        self.mean_curvature = None
        #: the median eigenvalue of the Hessian per particle, in ``SPECTRUM_MAX_DIM``
        #: dimensions or fewer (else ``None``)
        self.median_curvature = None
        self.noise_variance = None
        #: the mean gradient-noise variance over directions, ``tr(C) / D``, per particle
        self.mean_noise_variance = None
        #: the largest eigenvalue of the repulsion's ``K / L`` (1 without repulsion)
        self.coupling_eigenvalue = 1.0
        #: the mean over particle modes of the coupling ``mean(mu^p)`` (the curvature's
        #: share of the pooled draws' error, and their relaxation rate), and the share of
        #: the minibatch noise, ``tr((K/L)^p C) / tr(C)`` over the particles' noise
        #: covariance ``C`` (1 without repulsion)
        self.mean_coupling = 1.0
        self.noise_coupling = 1.0
        self._noise_shares = None
        #: the step of stationary variance error ``tolerance``: the second half of warm-up
        #: and every draw after it
        self.step_size = None
        #: the faster step of the first half of warm-up
        self.early_step_size = None
        self.estimates = 0
        self._since_restart = 0
        self._settling = False
        self._stiffest_error = None  # stiffest_error() of the current estimates

    def _running(self, old, new):
        # A plain average of the estimates since the last restart while there are fewer
        # than 1 / (1 - smoothing) of them, a moving average after.
        if old is None:
            return new
        past = self._since_restart / (self._since_restart + 1.0)
        if not self._settling:
            past = min(self.smoothing, past)
        return past * old + (1.0 - past) * new

    def restart(self):
        """Forget the running estimates (not the power-iteration directions): the first
        iterations from a random direction underestimate the curvature."""
        self.curvature = self.mean_curvature = self.noise_variance = None
        self.median_curvature = self.mean_noise_variance = self._noise_shares = None
        self._since_restart = 0

    @property
    def settling(self) -> bool:
        """Whether :meth:`settle` was called: the estimates are plain averages."""
        return self._settling

    def settle(self):
        """Restart the estimates and average all the later ones equally: the step frozen
        at the end of warm-up rests on every estimate of its second half (a moving average
        of a few noisy gradient differences would make the step itself noisy)."""
        self.restart()
        self._settling = True

    def start(self, potential, z, mass=None, repulsion=None, shard=None, conditioned=None):
        """The :attr:`initial_iterations` at the starting particles: the directions converge
        over the first half, the estimates are the average of the second half."""
        for iteration in range(self.initial_iterations):
            if iteration == self.initial_iterations // 2:
                self.restart()
            self.observe(potential, z, mass, repulsion, shard, conditioned)
        self.interval = 1
        return self.step_size

    def due(self, step: int) -> bool:
        """Whether warm-up step ``step`` (after the start) takes an estimate."""
        if self.next_estimate is None:  # a state saved before the schedule adapted
            return step % self.every == 0
        return step >= self.next_estimate

    def observe(self, potential, z, mass=None, repulsion=None, shard=None, conditioned=None):
        """
        One power iteration at particles ``z`` ``(L, D)`` (this rank's, when sharded) with
        two fresh minibatches, and the step size it gives. ``mass`` is AdamSGLD's diagonal
        mass ``(L, D)`` (the estimates are then in its preconditioned coordinates);
        ``conditioned`` the discrete sites' per-particle values (inside Gibbs).
        """
        z = z.detach()
        if self.curvature_direction is None:
            # Directions for every particle from the shared random stream, this rank's rows
            # kept: a sharded run draws what the single-process run draws.
            num_particles = z.shape[0] if shard is None else shard.num_particles
            directions = torch.randn(2, num_particles, z.shape[-1], dtype=z.dtype, device=z.device)
            if shard is not None:
                directions = torch.stack([shard.local(d) for d in directions])
            self.curvature_direction = _unit(directions[0], torch.ones_like(z))
            self.noise_direction = _unit(directions[1], torch.ones_like(z))
            self.noise_moment = torch.zeros_like(z)
        scale = None if mass is None else mass.rsqrt()
        direction = self.curvature_direction
        probe = direction if scale is None else direction * scale
        if shard is None:
            first, second = (potential.draw_subsamples(z.device) for _ in range(2))
        else:
            first, second = (shard.subsamples(potential, z.device) for _ in range(2))
        # Hutchinson's probe of the mean curvature tr(H) / D (Rademacher signs; in the
        # mass's coordinates, as the step is): how fast a typical direction relaxes.
        # Drawn for every particle from the shared random stream, this rank's rows kept (as
        # the directions above): a sharded run draws what the single-process run draws.
        num_particles = z.shape[0] if shard is None else shard.num_particles
        signs = torch.randint(0, 2, (num_particles, z.shape[-1]), device=z.device)
        signs = signs.to(z.dtype) * 2 - 1
        if shard is not None:
            signs = shard.local(signs)
        signs_probe = signs if scale is None else signs * scale
        with torch.enable_grad(), pyro.validation_enabled(False):
            leaf = z.requires_grad_(True)
            log_density = potential.log_density_all(leaf, first, conditioned=conditioned)
            (grad,) = torch.autograd.grad(log_density.sum(), leaf, create_graph=True)
            (hessian_probe,) = torch.autograd.grad((grad * probe).sum(), leaf, retain_graph=True)
            low_dimensional = z.shape[-1] <= SPECTRUM_MAX_DIM
            (hessian_signs,) = torch.autograd.grad(
                (grad * signs_probe).sum(), leaf, retain_graph=low_dimensional
            )
            if low_dimensional:
                # The whole Hessian, one coordinate (in the mass's coordinates) at a time.
                columns = []
                for k in range(z.shape[-1]):
                    unit = torch.zeros_like(z)
                    unit[:, k] = 1.0 if scale is None else scale[:, k]
                    last = k == z.shape[-1] - 1
                    (column,) = torch.autograd.grad(
                        (grad * unit).sum(), leaf, retain_graph=not last
                    )
                    columns.append(column)
        _, other_grad = potential.log_density_and_grad(z, second, conditioned)
        # H of the potential -log p: the Hessian-vector product of log p, negated.
        product, difference = -hessian_probe, grad.detach() - other_grad
        if shard is not None and shard.mode == "data":
            product, difference = shard.mean(product), shard.mean(difference)
        if scale is not None:
            product, difference = product * scale, difference * scale
        signs_product = -hessian_signs
        if shard is not None and shard.mode == "data":
            signs_product = shard.mean(signs_product)
        if scale is not None:
            signs_product = signs_product * scale
        mean_curvature = (signs * signs_product).mean(-1)
        median_curvature = None
        if low_dimensional:
            hessian = -torch.stack(columns, -1)  # (L, D, D): column k is H e_k
            if shard is not None and shard.mode == "data":
                hessian = shard.mean(hessian)
            if scale is not None:
                hessian = hessian * scale.unsqueeze(-1)
            hessian = (hessian + hessian.transpose(-1, -2)) / 2
            median_curvature = torch.linalg.eigvalsh(hessian.double()).median(-1).values
            median_curvature = median_curvature.to(z.dtype)
        curvature = (direction * product).sum(-1).abs()
        self.curvature_direction = _unit(product, direction)
        # Var(difference) = 2 C: the Rayleigh quotient of C at a direction chosen before
        # this draw, and a power iteration on the running second moment of the draws.
        noise = (difference * self.noise_direction).sum(-1).square() / 2.0
        # E |g1 - g2|^2 = 2 tr(C): the mean noise variance over directions, no probe needed.
        mean_noise = difference.square().mean(-1) / 2.0
        projected = difference * (difference * self.noise_direction).sum(-1, keepdim=True)
        self.noise_moment = self._running(self.noise_moment, projected)
        self.noise_direction = _unit(self.noise_moment, self.noise_direction)
        if shard is not None and shard.mode == "particles":
            curvature, noise = shard.gather(curvature), shard.gather(noise)
        if shard is not None and shard.mode == "particles":
            mean_curvature = shard.gather(mean_curvature)
            mean_noise = shard.gather(mean_noise)
            if median_curvature is not None:
                median_curvature = shard.gather(median_curvature)
        self.mean_curvature = self._running(self.mean_curvature, mean_curvature)
        self.mean_noise_variance = self._running(self.mean_noise_variance, mean_noise)
        if median_curvature is not None:
            self.median_curvature = self._running(self.median_curvature, median_curvature)
        running = self._running(self.curvature, curvature)
        if self._settling:
            self.interval = self.every
        else:
            # Out of the start the curvature grows as the particles reach the posterior (a
            # BNN's noise precision, and with it every weight's curvature, by 100x within
            # warm-up's first steps): a running average lags, and a step sized on it is
            # unstable where the particles are now, so the step must be stable at the
            # curvature measured last; and while it grows, the next estimate comes at the
            # next step (ten steps at a stale step size let them blow up).
            growth = 1.0 if self.curvature is None else float((curvature / self.curvature).max())
            stale = growth > CURVATURE_GROWTH
            self.interval = 1 if stale else min(self.every, 2 * self.interval)
            running = torch.maximum(running, curvature)
        self.curvature = running
        self.noise_variance = self._running(self.noise_variance, noise)
        self._since_restart += 1
        if repulsion is not None:
            self._observe_coupling(repulsion, z, difference, shard)
        self.estimates += 1
        self._stiffest_error = None
        self.step_size = self.bounded_step_size(self.tolerance)
        # The first half of warm-up runs faster only along the stiffest direction's bound:
        # never hotter on average over directions than the kept step (a typical direction
        # at error 1 lets a BNN's particles jump to a basin they never leave, such as a noise
        # precision near 0), and never slower than the kept step.
        faster = min(
            self._stiffest_step_size(max(self.early_tolerance, self.tolerance), noise=True),
            self._stiffest_step_size(max(self.stability_tolerance, self.tolerance), noise=False),
        )
        self.early_step_size = max(faster, self.step_size)
        return self.step_size

    def _observe_coupling(self, repulsion, z, difference, shard):
        # With K / L = U diag(mu) U^T fixed, the linear recursion separates into one scalar
        # recursion per particle mode k and direction: mode k moves with the step
        # eps mu_k^p, and gets the minibatch noise u_k^T zeta, whose variance is
        # u_k^T C_particles u_k (the minibatch is shared, so the particles' noises are
        # correlated). The pooled draws' variance error is the mean over the modes, so to
        # first order the curvature's share scales with mean(mu^p) = tr((K/L)^p) / L and the
        # noise's with tr((K/L)^p C_particles) / tr(C_particles). The largest mu^p (the
        # ensemble's mean mode, the fastest) bounds stability.
        if shard is not None and shard.mode == "particles":
            z, difference = shard.gather(z), shard.gather(difference)
        with torch.no_grad():
            matrix = stein_coupling(repulsion, z, False).matrix.double() / z.shape[0]
            eigenvalues = torch.linalg.eigvalsh(matrix).clamp_min(0.0)
            power = torch.linalg.matrix_power(matrix, self.coupling_power)
            noise = difference.detach().double()
            noise = noise @ noise.transpose(-1, -2)  # (L, L): the particles' noise Gram
            shares = torch.stack([(power * noise).sum(), noise.diagonal().sum()])
        self.coupling_eigenvalue = float(eigenvalues.max())
        self.mean_coupling = float(eigenvalues.pow(self.coupling_power).mean())
        # A ratio of running sums: one minibatch pair in a few dimensions is a noisy Gram.
        self._noise_shares = self._running(self._noise_shares, shares)
        numerator, denominator = (float(x) for x in self._noise_shares)
        if denominator > 0:
            low, high = float(eigenvalues.min()), self.coupling_eigenvalue
            ratio = numerator / denominator
            self.noise_coupling = min(
                max(ratio, low**self.coupling_power), high**self.coupling_power
            )
        else:
            self.noise_coupling = self.mean_coupling

    def bounded_step_size(self, tolerance: float, noise: bool = True) -> float:
        """
        The step of the current estimates under :attr:`bound` at ``tolerance``
        (``noise=False``: the stiffest direction's, from the curvature alone):

        - ``"stiffest"``: the stationary variance error is ``tolerance`` in the stiffest
          direction (the largest curvature and the largest gradient-noise variance); with
          repulsion, that of the draws pooled over the particles, and the ensemble's mean
          mode kept stable;
        - ``"typical"``: it is ``tolerance`` on average over directions (the error at the
          mean curvature ``tr(H) / D`` and the mean noise variance ``tr(C) / D``, which
          the error's first order makes the mean of the directions' errors), and the
          stiffest direction stays stable (its error from the curvature alone is at most
          ``stability_tolerance``); never below ``"stiffest"``'s step;
        - ``"auto"``: ``"stiffest"``'s step when a typical direction relaxes at it
          :data:`MIXING_RELAXATIONS` times within :attr:`kept_steps`, else the smallest
          larger step at which it does, up to ``"typical"``'s: the least biased step with
          which the kept draws mix.
        """
        stiffest = self._stiffest_step_size(tolerance, noise)
        if self.bound == "stiffest" or not noise:
            return stiffest
        typical = self.typical_step_size(tolerance)
        if self.bound == "typical":
            return max(stiffest, typical)
        return max(stiffest, min(self.mixing_step_size(), typical))

    def _stiffest_step_size(self, tolerance: float, noise: bool) -> float:
        # "stiffest"'s step (noise=False: from the curvature alone).
        return min(
            self._pooled_step_size(
                float(self.curvature.max()),
                float(self.noise_variance.max()) if noise else 0.0,
                tolerance,
            ),
            self._stable_step_size(max(tolerance, self.stability_tolerance)),
        )

    def _pooled_step_size(self, curvature: float, noise_variance: float, tolerance: float):
        # The step whose error, pooled over the particle modes of the repulsion's K / L, is
        # ``tolerance`` (see _observe_coupling): one mode of step eps * mean(mu^p), whose
        # noise is scaled by the noise's share; the plain sampler's step without repulsion.
        share = self.noise_coupling / self.mean_coupling
        step_size = bias_bounded_step_size(
            curvature, noise_variance * share, self.friction, tolerance
        )
        return step_size / self.mean_coupling

    def _stable_step_size(self, tolerance: float) -> float:
        # The step at which the ensemble's mean mode (the largest eigenvalue mu of K / L,
        # coupling_power times) has error ``tolerance`` in the stiffest direction from the
        # curvature alone: the stability margin (the minibatch noise cannot destabilise).
        step_size = bias_bounded_step_size(
            float(self.curvature.max()), 0.0, self.friction, tolerance
        )
        return step_size / self.coupling_eigenvalue**self.coupling_power

    def typical_step_size(self, tolerance: float) -> float:
        """The step of mean stationary variance error ``tolerance`` over directions (and,
        with repulsion, particle modes), at most the stiffest direction's stable step
        (``"typical"`` in :meth:`bounded_step_size`)."""
        stable = self._stable_step_size(self.stability_tolerance)
        mean_curvature = max(float(self.mean_curvature.max()), 0.0)
        mean_noise = max(float(self.mean_noise_variance.max()), 0.0)
        if not mean_curvature + mean_noise > 0:
            return stable
        return min(self._pooled_step_size(mean_curvature, mean_noise, tolerance), stable)

    def mixing_step_size(self) -> float:
        """The step at which a typical direction relaxes (:meth:`relaxation_steps`)
        :data:`MIXING_RELAXATIONS` times within :attr:`kept_steps`; ``inf`` where the
        typical curvature is not positive."""
        typical = float(self._typical_curvature().max())
        if not typical > 0 or not self.kept_steps:
            return math.inf
        rate = MIXING_RELAXATIONS * self.friction / self.kept_steps
        return rate / (typical * self.mean_coupling)

    def _typical_curvature(self) -> torch.Tensor:
        return self.mean_curvature if self.median_curvature is None else self.median_curvature

    def stiffest_error(self) -> float:
        """The stationary variance error of the current step in the stiffest direction,
        of the draws pooled over the particles (``bias_tolerance`` under ``"stiffest"``;
        larger where ``"auto"`` or ``"typical"`` raised the step)."""
        if self.step_size is None:
            return math.nan
        # Asked once per particle when a run's draws are collected: solved once per estimate.
        if self._stiffest_error is not None:
            return self._stiffest_error
        share = self.noise_coupling / self.mean_coupling
        error = stationary_variance_error(
            self.step_size * self.mean_coupling,
            float(self.curvature.max()),
            float(self.noise_variance.max()) * share,
            self.friction,
        )
        self._stiffest_error = error
        return error

    def relaxation_steps(self) -> float:
        r"""
        About how many steps a typical direction of the local Gaussian approximation takes
        to relax at the current step: :math:`a / (\epsilon \overline{\mu^p} \bar\lambda)`
        for a typical curvature :math:`\bar\lambda` (the largest over the particles), the
        friction :math:`a` (1 for SGLD) and the repulsion's mean coupling
        :math:`\overline{\mu^p}` over the particle modes;
        ``2 / a`` where the momentum recursion is underdamped. The typical curvature is the
        median eigenvalue of the Hessian in :data:`SPECTRUM_MAX_DIM` dimensions or fewer,
        else the mean curvature :math:`\mathrm{tr}(H) / D` (Hutchinson's estimate), which
        is at least the median where most directions are flat. So this is a lower bound on
        a typical direction's relaxation: when even it exceeds the steps a run keeps, the
        draws have not mixed. ``inf`` before the first estimate or where the typical
        curvature is not positive.
        """
        if self.step_size is None or self.mean_curvature is None:
            return math.inf
        typical = self._typical_curvature()
        rate = self.step_size * self.mean_coupling * float(typical.max())
        if not rate > 0:
            return math.inf
        a = self.friction
        return 2.0 / a if rate > a * a / 4.0 else a / rate

    def state_dict(self):
        return {
            name: getattr(self, name)
            for name in (
                "curvature_direction",
                "noise_direction",
                "noise_moment",
                "curvature",
                "mean_curvature",
                "median_curvature",
                "noise_variance",
                "mean_noise_variance",
                "coupling_eigenvalue",
                "mean_coupling",
                "noise_coupling",
                "_noise_shares",
                "step_size",
                "early_step_size",
                "estimates",
                "_since_restart",
                "_settling",
                "interval",
                "next_estimate",
            )
        }

    def load_state_dict(self, state):
        # A state saved before 0.x has no mean coupling: its relaxation read the largest.
        largest = state.get("coupling_eigenvalue", 1.0) ** self.coupling_power
        state = {"mean_coupling": largest, "noise_coupling": largest, **state}
        for name, value in state.items():
            setattr(self, name, value)
        self._stiffest_error = None
