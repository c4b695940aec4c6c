r"""
Fitting discrete hidden Markov models by expectation-maximisation (Baum-Welch).

The E-step's expected sufficient statistics are exact:
:func:`~pyro_ext.timeseries.hmm.hmm_expected_statistics` gives the posterior marginals
:math:`\gamma_t(k) = p(z_t = k \mid x_{1:T})` and the expected transition counts
:math:`\sum_t \xi_t(j, k)` from one forward-backward pass of the parallel scans. The M-step is the closed-form maximum-likelihood
update of each parameter (categorical, Poisson or Gaussian emissions). Every iteration
raises the log-likelihood, which the fit checks.

EM finds a local maximum, and the states' labels are arbitrary: :func:`fit_hmm_em` runs
several starts (the first spread over the data's quantiles, the others random) and keeps the
best. Missing observations (NaN) are marginalised: they count in the transitions, not in the
emissions.
"""

import math
from typing import NamedTuple

import torch

from ..ops.validation import check_int, check_positive, values_checked
from .hmm import hmm_expected_statistics

__all__ = ["HMMFit", "fit_hmm_em"]

#: The smallest probability or Gaussian scale the M-step returns: a state that explains no
#: observation keeps a finite log-likelihood.
FLOOR = 1e-10


class HMMFit(NamedTuple):
    r"""
    A fitted HMM.

    :ivar dict params: the parameters by the model's site names (``"init_probs"``,
        ``"transition_probs"`` and the emission's), ready for
        :meth:`~pyro_ext.timeseries.HiddenMarkovModel.distribution`, ``viterbi``,
        ``smooth`` and ``forecast``.
    :ivar float log_likelihood: :math:`\log p(y \mid \text{params})`, summed over series.
    :ivar int num_iterations: EM iterations of the kept start.
    :ivar bool converged: whether the kept start's last iteration raised the log-likelihood
        by less than ``tolerance`` per observation.
    :ivar list restart_log_likelihoods: the final log-likelihood of every start, the kept
        one the largest: starts that end far below it found other local maxima.
    """

    params: dict
    log_likelihood: float
    num_iterations: int
    converged: bool
    restart_log_likelihoods: list


def _present(y):
    return ~torch.isnan(y) if y.is_floating_point() else torch.ones_like(y, dtype=torch.bool)


def _check_observations(y, emission, num_symbols=None):
    """
    The observed values of ``y`` against a built-in emission's support: finite for
    ``"gaussian"``, non-negative integer counts for ``"poisson"``, integer symbols in ``[0,
    num_symbols)`` for ``"categorical"``; NaN marks a missing value and passes. A bad value
    raises a ``ValueError`` naming ``y``, the value and its first index (rather than
    torch.distributions' support error, or an index error deep in the recursions).
    """
    present = _present(y)
    if emission == "gaussian":
        bad, expected = present & torch.isinf(y), "finite values (NaN marks a missing one)"
    else:
        integral = y == torch.floor(y) if y.is_floating_point() else present
        bad = present & (~integral | (y < 0))
        expected = "non-negative integer counts (NaN marks a missing one)"
        if emission == "categorical":
            bad = bad | (present & (y >= num_symbols))
            expected = (
                f"integer symbols in [0, {num_symbols}) (num_symbols {num_symbols}; NaN marks "
                "a missing one)"
            )
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        index = index[0] if len(index) == 1 else index
        raise ValueError(
            f"y must hold {expected} for {emission} emissions; got {y[bad][0].item()} at "
            f"index {index}"
        )


class _EmissionTerms:
    r"""
    What the emission log-densities need from the data, computed once per fit rather than at
    every EM iteration: the observed values (0 where missing), the symbols' indices, and the
    Poisson's :math:`\log y!`, which does not change between iterations (its ``lgamma``
    over the data was a fifth of a Poisson iteration). :meth:`log_probs` gives
    torch.distributions' ``log_prob``: the Poisson's term for term with that constant, the
    others through the distributions themselves, without checking their arguments at each
    iteration (the M-step's parameters are valid by construction).
    """

    def __init__(self, kind, y, present):
        self.kind = kind
        self.missing = None if bool(present.all()) else ~present.unsqueeze(-1)
        self.filled = torch.where(present, y, torch.zeros_like(y)).unsqueeze(-1)
        if kind == "categorical":
            self.symbols = self.filled.squeeze(-1).long()
        elif kind == "poisson":
            self.log_factorial = (self.filled + 1).lgamma()

    def log_probs(self, params):
        """``(..., T, K)`` emission log-probabilities at ``params``, 0 where ``y`` is
        missing."""
        if self.kind == "categorical":
            log_probs = params["emission_probs"].log().T[self.symbols]
        elif self.kind == "poisson":
            # torch.distributions.Poisson.log_prob: y log(rate) - rate - log(y!)
            rates = params["emission_rates"]
            log_probs = self.filled.xlogy(rates) - rates - self.log_factorial
        else:
            loc, scale = params["emission_loc"], params["emission_scale"]
            log_probs = torch.distributions.Normal(loc, scale, validate_args=False).log_prob(
                self.filled
            )
        if self.missing is None:
            return log_probs
        return log_probs.masked_fill(self.missing, 0.0)


def _emission_update(kind, weights, y, present, num_symbols, data_scale):
    """The M-step of the emission: ``weights`` ``(..., T, K)`` are zero at missing steps."""
    flat_w = weights.reshape(-1, weights.shape[-1])
    flat_y = torch.where(present, y, torch.zeros_like(y)).reshape(-1)
    totals = flat_w.sum(0).clamp_min(FLOOR)
    if kind == "categorical":
        onehot = torch.nn.functional.one_hot(flat_y.long(), num_symbols).to(flat_w.dtype)
        probs = (flat_w.T @ onehot).clamp_min(FLOOR)
        return {"emission_probs": probs / probs.sum(-1, keepdim=True)}
    mean = (flat_w * flat_y.unsqueeze(-1)).sum(0) / totals
    if kind == "poisson":
        return {"emission_rates": mean.clamp_min(FLOOR)}
    variance = (flat_w * (flat_y.unsqueeze(-1) - mean) ** 2).sum(0) / totals
    # A state that owns one point would shrink to a zero scale and an infinite likelihood.
    floor = max(1e-3 * data_scale, FLOOR)
    return {"emission_loc": mean, "emission_scale": variance.sqrt().clamp_min(floor)}


def _start(kind, num_states, num_symbols, y, present, generator, spread):
    """A starting point: ``spread`` places the emissions at the data's quantiles and the
    chain near uniform; otherwise every parameter is a random draw."""
    dtype, device = y.dtype, y.device
    values = y[present]
    K = num_states

    # Random starts are drawn on the CPU (the generator is a CPU one), so that a seed gives
    # the same starts on every device, then moved.
    def dirichlet(shape):
        gamma = torch.empty(shape, dtype=dtype, device="cpu").exponential_(generator=generator)
        return (gamma / gamma.sum(-1, keepdim=True)).to(device)

    if spread:
        init = torch.full((K,), 1.0 / K, dtype=dtype, device=device)
        trans = torch.full((K, K), 0.1 / K, dtype=dtype, device=device)
        trans = trans + 0.9 * torch.eye(K, dtype=dtype, device=device)
        levels = torch.linspace(0.5 / K, 1 - 0.5 / K, K, dtype=dtype, device=device)
    else:
        init, trans = dirichlet((K,)), dirichlet((K, K))
        levels = torch.rand(K, generator=generator, dtype=dtype, device="cpu").to(device)
    params = {"init_probs": init, "transition_probs": trans}
    if kind == "categorical":
        counts = torch.bincount(values.long(), minlength=num_symbols).to(dtype) + 1.0
        frequencies = counts / counts.sum()
        noise = dirichlet((K, num_symbols))
        mixed = frequencies + (0.5 if spread else 1.0) * noise
        params["emission_probs"] = mixed / mixed.sum(-1, keepdim=True)
    elif kind == "poisson":
        params["emission_rates"] = torch.quantile(values, levels).clamp_min(0.1)
    else:
        params["emission_loc"] = torch.quantile(values, levels)
        scale = values.std() if values.numel() > 1 else values.new_tensor(1.0)
        params["emission_scale"] = torch.full((K,), float(scale) / K, dtype=dtype, device=device)
        params["emission_scale"] = params["emission_scale"].clamp_min(FLOOR)
    return params


def _m_step(stats, emission, y, present, num_symbols, data_scale):
    posterior = stats.posterior
    num_states = posterior.shape[-1]
    first = posterior[..., 0, :].reshape(-1, num_states).sum(0)
    counts = stats.transition_counts.clamp_min(FLOOR)
    params = {
        "init_probs": (first / first.sum()).clamp_min(FLOOR),
        "transition_probs": counts / counts.sum(-1, keepdim=True),
    }
    weights = posterior * present.unsqueeze(-1)
    params.update(_emission_update(emission, weights, y, present, num_symbols, data_scale))
    return params


def fit_hmm_em(
    y,
    num_states,
    emission,
    num_symbols=None,
    *,
    fixed=None,
    init=None,
    num_restarts=5,
    max_iterations=200,
    tolerance=1e-6,
    seed=0,
):
    r"""
    Maximum-likelihood parameters of a discrete HMM by EM (Baum-Welch), the best of
    ``num_restarts`` starts.

    :param torch.Tensor y: one series ``(T,)`` or several of one length ``(S, T)``; NaN
        marks a missing value. EM runs in ``y``'s floating dtype, in float64 for integer
        ``y``.
    :param int num_states: ``K``.
    :param str emission: ``"categorical"``, ``"poisson"`` or ``"gaussian"``.
    :param int num_symbols: ``M`` for categorical emissions.
    :param dict fixed: parameters held at given values (site names as in
        :class:`~pyro_ext.timeseries.HiddenMarkovModel`), not updated.
    :param dict init: every parameter's starting value (same names), for the first start
        instead of the quantile spread (a warm start, or another library's start).
    :param int num_restarts: starts; the first spreads the emissions over the data's
        quantiles, the others are random (``seed``).
    :param int max_iterations: EM iterations per start, at most.
    :param float tolerance: a start stops when an iteration raises the log-likelihood by
        less than ``tolerance`` per observed value.
    :returns: :class:`HMMFit`.
    """
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor of shape (T,) or (S, T), got {type(y).__name__}")
    if y.dim() not in (1, 2) or y.shape[-1] < 1:
        raise ValueError(f"y must have shape (T,) or (S, T) with T >= 1, got {tuple(y.shape)}")
    if emission not in ("categorical", "poisson", "gaussian"):
        raise ValueError(
            "fit_hmm_em fits emission='categorical', 'poisson' or 'gaussian' (closed-form "
            f"M-steps), got {emission!r}; fit a custom emission with SVI or MCMC"
        )
    num_states = check_int(num_states, "num_states", low=1)
    num_restarts = check_int(num_restarts, "num_restarts", low=1)
    max_iterations = check_int(max_iterations, "max_iterations", low=1)
    tolerance = check_positive(tolerance, "tolerance")
    if emission == "categorical":
        num_symbols = check_int(num_symbols, "num_symbols", low=1)
    fixed = dict(fixed or {})
    if values_checked():
        _check_observations(y, emission, num_symbols)
    present = _present(y)
    num_observed = int(present.sum())
    if num_observed == 0:
        raise ValueError("y holds no observed value (all NaN): nothing to fit")
    if not y.is_floating_point():
        # Integer symbols or counts: EM's small late gains need double precision (in
        # float32 a 2000-step log-likelihood carries round-off near the stopping tolerance).
        y = y.to(torch.float64)
    fixed = {name: torch.as_tensor(value).to(y) for name, value in fixed.items()}
    values = y[present]
    data_scale = float(values.std()) if values.numel() > 1 else 1.0
    generator = torch.Generator().manual_seed(seed)
    mask = None if bool(present.all()) else present
    terms = _EmissionTerms(emission, y, present)
    results = []
    for restart in range(num_restarts):
        if restart == 0 and init is not None:
            params = {name: torch.as_tensor(value).to(y) for name, value in init.items()}
        else:
            params = _start(emission, num_states, num_symbols, y, present, generator, restart == 0)
        params.update(fixed)
        previous, converged = -math.inf, False
        for iteration in range(max_iterations + 1):
            stats = hmm_expected_statistics(
                params["init_probs"].log(),
                params["transition_probs"].log(),
                terms.log_probs(params),
                mask,
            )
            log_likelihood = float(stats.log_likelihood.sum())
            if log_likelihood < previous - 1e-6 * max(1.0, abs(previous)):
                raise RuntimeError(
                    f"EM lowered the log-likelihood ({previous:.6f} -> {log_likelihood:.6f}) "
                    f"at iteration {iteration}: a bug, please report it"
                )
            if log_likelihood - previous < tolerance * num_observed:
                converged = True
                break
            if iteration == max_iterations:
                break
            previous = log_likelihood
            params = {**_m_step(stats, emission, y, present, num_symbols, data_scale), **fixed}
        results.append((log_likelihood, iteration, converged, params))
    best = max(results, key=lambda result: result[0])
    return HMMFit(
        params=best[3],
        log_likelihood=best[0],
        num_iterations=best[1],
        converged=best[2],
        restart_log_likelihoods=[result[0] for result in results],
    )
