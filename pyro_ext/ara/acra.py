"""
Adversarial risk analysis for adversarial classification with a generative classifier
(ACRA, Naveiro et al. 2019; thesis section 3.4.1, eqs. 3.8-3.12 and Algorithm 3.1).

The defender observes a possibly attacked instance :math:`x'` and decides its class with
eq. (3.9), where the unknown attack enters through the attacker model
:math:`p_C(x' \\mid x, y_1)`: the attacker inserts at most ``n`` words choosing
:math:`\\arg\\min_z P^A_z` (eq. 3.11) with random :math:`P^A_z \\sim \\mathcal{B}e` of mean
:math:`r(z) = p_C(y_1 \\mid z)`.
"""

import math

import numpy as np
import pyro
import pyro.distributions as dist
import scipy.special as sc
import torch
from pyro.distributions import TorchDistribution
from pyro.infer.importance import vectorized_importance_weights
from torch.distributions import constraints

from ..ops.validation import check_choice, check_int, check_real
from .naive_bayes import check_binary
from .words import attack_candidates, check_budget, originating_instances

__all__ = [
    "ACRA",
    "RandomWordInsertionAttack",
    "attack_log_probs",
    "attack_mc_probs",
    "beta_concentrations",
]

METHODS = ("exact", "mc", "sequential", "importance")
# Mass of the chosen candidate's Beta left outside the quadrature range, and the threshold
# below which a CDF counts as 0 (the absolute error of a probability is a few times this).
TAIL = 1e-12
# Beyond +20 the Beta's mass sits within 1e-9 of 1, which float64 cannot resolve; beyond -300
# its second concentration overflows. (The reference code clamps r at 1 - 1e-4.)
LOGIT_RANGE = (-300.0, 20.0)
_MC_CHUNK = 1 << 22  # Beta draws held in memory at once by the Monte Carlo estimate


def _gauss_legendre_panels():
    """Panels ``(u, log_weight, upper)`` covering ``[TAIL, 1 - TAIL]`` in increasing ``u``;
    for the upper half the nodes are stored as ``1 - u``, which keeps them exact near 1."""
    # Refined geometrically towards u = 0 and u = 1, where a competitor whose mean lies a few
    # standard deviations away switches from irrelevant to decisive.
    edges = [TAIL, 1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 0.05, 0.15, 0.3, 0.5]
    nodes, weights = np.polynomial.legendre.leggauss(8)
    lower = [
        ((b - a) / 2 * nodes + (a + b) / 2, np.log((b - a) / 2 * weights))
        for a, b in zip(edges, edges[1:])
    ]
    upper = [(u[::-1], log_w[::-1]) for u, log_w in reversed(lower)]
    return [(u, log_w, False) for u, log_w in lower] + [(u, log_w, True) for u, log_w in upper]


_PANELS = _gauss_legendre_panels()


def check_var(var):
    """``var``, a proportion of the largest unimodal Beta variance, in ``(0, 1]``."""
    return check_real(var, "var (a proportion of the maximum variance)", 0, 1, low_open=True)


def beta_concentrations(logit, var):
    """
    Concentrations :math:`(\\delta_1, \\delta_2)` of the attacker's random probability
    :math:`P^A_z \\sim \\mathcal{B}e(\\delta_1, \\delta_2)` (section 3.4.1, below eq. 3.11) with
    mean :math:`r = \\sigma(\\text{logit})` and variance ``var`` times
    :math:`r \\min\\{r(1-r)/(1+r), (1-r)^2/(2-r)\\}`, the largest variance of a unimodal Beta
    (:math:`\\delta_1, \\delta_2 \\ge 1`) with mean :math:`r` -- the rule of the authors' code
    (roinaveiro/ACRA_spam_experiment), which keeps every ``var`` in (0, 1] feasible.

    :param torch.Tensor logit: Log-odds :math:`\\log r/(1-r)`; clamped to ``LOGIT_RANGE``.
    :param float var: Proportion of the maximum variance, in (0, 1]. ``var -> 0`` is the
        deterministic attacker of common knowledge.
    :returns: ``(delta1, delta2)``, float64 tensors shaped like ``logit``.
    """
    logit = logit.to(torch.float64).clamp(*LOGIT_RANGE)
    r, s = torch.sigmoid(logit), torch.sigmoid(-logit)  # s = 1 - r without cancellation
    max_share = torch.minimum(r * s / (1 + r), s * s / (2 - r))
    delta1 = r * s / (var * max_share) - r
    return delta1, delta1 * s / r


def _numpy(t):
    return t.detach().cpu().numpy()


def _log_argmin_probs(chosen, alpha, beta, logit, row, num_rows):
    """
    :math:`\\log \\Pr(\\arg\\min_z P_z = z^*)` for independent Beta variables, by the
    one-dimensional integral :math:`\\int_0^1 h(u)\\, du`,
    :math:`h(u) = \\prod_{z \\ne z^*} (1 - F_z(Q^*(u)))` with :math:`Q^*` the chosen
    candidate's quantile function: Gauss-Legendre on panels in ``u``, the product in log space.

    ``h`` decreases in ``u``, which bounds what is left of the integral and lets a row stop
    once that rest is below ``TAIL``; competitors whose CDF is below ``TAIL`` over the whole range
    are left out. Each probability is thus exact up to a few ``TAIL`` (absolute).

    :param tuple chosen: ``(delta1, delta2)`` of :math:`z^*`, shared by every row.
    :param alpha, beta: Competitors' concentrations, flat numpy arrays.
    :param logit: Competitors' log-odds, to screen out sure losers cheaply.
    :param row: The row (set of candidates) each competitor belongs to.
    :returns: numpy array ``(num_rows,)``.
    """
    a_star, b_star = chosen
    p_lo, p_hi = sc.betaincinv(a_star, b_star, TAIL), sc.betainccinv(a_star, b_star, TAIL)
    log_tail = math.log(TAIL)
    # A competitor almost surely below the whole range of P* makes z* a sure loser; the one
    # of smallest mean is the natural suspect, and one CDF per row settles it.
    lowest = np.full(num_rows, np.inf)
    np.minimum.at(lowest, row, logit)
    suspect = logit == lowest[row]
    done = np.zeros(num_rows, bool)
    np.logical_or.at(done, row[suspect], sc.betaincc(alpha[suspect], beta[suspect], p_lo) < TAIL)
    # Competitors almost surely above the range never beat z*: their factor is 1.
    keep = ~done[row]
    keep[keep] = sc.betainc(alpha[keep], beta[keep], p_hi) >= TAIL
    alpha, beta, row = alpha[keep], beta[keep], row[keep]
    # h(TAIL) bounds the whole integral.
    with np.errstate(divide="ignore"):
        log_h = np.zeros(num_rows)
        np.add.at(log_h, row, np.log(sc.betaincc(alpha, beta, p_lo)))
    done |= log_h < log_tail
    log_integral = np.full(num_rows, -np.inf)
    for u, log_w, upper in _PANELS:
        if done.all():
            break
        active = ~done[row]
        quantile = sc.betainccinv if upper else sc.betaincinv
        nodes = quantile(a_star, b_star, u)
        log_h = np.zeros((num_rows, u.size))
        with np.errstate(divide="ignore"):
            terms = np.log(sc.betaincc(alpha[active, None], beta[active, None], nodes))
        np.add.at(log_h, row[active], terms)
        panel = sc.logsumexp(log_h + log_w, axis=-1)
        log_integral[~done] = np.logaddexp(log_integral, panel)[~done]
        done |= log_h[:, -1] + math.log(u[-1] if upper else 1 - u[-1]) < log_tail
    return log_integral


def _candidate_sets(originals, n, insert):
    """Flat attack candidates of every original row, with the row index of each."""
    sets = [attack_candidates(x, n, insert) for x in originals]
    sizes = torch.tensor([c.shape[0] for c in sets], device=originals.device)
    row = torch.repeat_interleave(torch.arange(len(sets), device=originals.device), sizes)
    return torch.cat(sets), row, sizes


def attack_log_probs(x_prime, originals, logit_fn, n, var, insert=True):
    """
    Exact :math:`\\log p_C(x' \\mid x, y_1)` (the limit of eq. 3.12) for one observed
    ``x_prime`` and each row ``x`` of ``originals``, by quadrature.

    :param torch.Tensor x_prime: Observed row ``(D,)``.
    :param torch.Tensor originals: Candidate originating rows ``(B, D)``.
    :param callable logit_fn: Maps ``(M, D)`` rows to the log-odds of :math:`r(z)`.
    :returns: Tensor ``(B,)``, dtype and device of ``originals``; ``-inf`` where ``x_prime``
        is not reachable from ``x``.
    """
    unique, inverse = torch.unique(originals, dim=0, return_inverse=True)
    candidates, row, _ = _candidate_sets(unique, n, insert)
    is_star = (candidates == x_prime).all(-1)
    logit = torch.as_tensor(logit_fn(candidates)).double().clamp(*LOGIT_RANGE)
    alpha, beta = beta_concentrations(logit, var)
    chosen = beta_concentrations(torch.as_tensor(logit_fn(x_prime.unsqueeze(0))), var)
    others = _numpy(~is_star)
    result = _log_argmin_probs(
        (_numpy(chosen[0])[0], _numpy(chosen[1])[0]),
        _numpy(alpha)[others],
        _numpy(beta)[others],
        _numpy(logit)[others],
        _numpy(row)[others],
        unique.shape[0],
    )
    reachable = torch.zeros(unique.shape[0], dtype=torch.bool, device=row.device)
    reachable.index_put_((row[is_star],), torch.ones_like(row[is_star], dtype=torch.bool))
    result = torch.as_tensor(result, dtype=originals.dtype, device=originals.device)
    return result.masked_fill(~reachable, -math.inf)[inverse]


def attack_mc_probs(x_prime, originals, logit_fn, n, var, num_samples, insert=True):
    """
    The Monte Carlo estimate (3.12) of :math:`p_C(x' \\mid x, y_1)`: the share of ``num_samples``
    draws of :math:`(P^A_z)_z` whose argmin is ``x_prime``, and its standard error.

    :returns: ``(estimate, stderr)``, tensors ``(B,)`` like ``originals``.
    """
    candidates, row, sizes = _candidate_sets(originals, n, insert)
    alpha, beta = beta_concentrations(torch.as_tensor(logit_fn(candidates)), var)
    is_star = (candidates == x_prime).all(-1)
    # Pad each row's candidates to a rectangle; padded P's are +inf and never the argmin.
    width = int(sizes.max())
    slot = torch.arange(candidates.shape[0], device=row.device) - (sizes.cumsum(0) - sizes)[row]
    shape = (originals.shape[0], width)
    pad_alpha = alpha.new_ones(shape).index_put_((row, slot), alpha)
    pad_beta = beta.new_ones(shape).index_put_((row, slot), beta)
    valid = torch.zeros(shape, dtype=torch.bool, device=row.device).index_put_(
        (row, slot), torch.ones_like(row, dtype=torch.bool)
    )
    star = torch.full((shape[0],), -1, dtype=torch.long, device=row.device).index_put_(
        (row[is_star],), slot[is_star]
    )
    hits = []
    chunk = max(1, _MC_CHUNK // (num_samples * width))
    for start in range(0, shape[0], chunk):
        block = slice(start, start + chunk)
        draws = dist.Beta(pad_alpha[block], pad_beta[block]).sample((num_samples,))
        winners = draws.masked_fill(~valid[block], math.inf).argmin(-1)
        hits.append((winners == star[block]).to(originals.dtype).mean(0))
    estimate = torch.cat(hits)
    return estimate, (estimate * (1 - estimate) / num_samples).sqrt()


class RandomWordInsertionAttack(TorchDistribution):
    """
    The defender's model :math:`p_C(x' \\mid x, y_1)` of an n-GWI attacker without common
    knowledge (eq. 3.11): for each candidate :math:`z` reachable from the original ``x`` by at
    most ``n`` insertions, :math:`P^A_z \\sim \\mathcal{B}e` with mean :math:`r(z)` (the
    defender's :math:`p_C(y_1 \\mid z)`) and variance set by ``var`` (see
    :func:`beta_concentrations`), independently; the attack is
    :math:`x' = \\arg\\min_z P^A_z`.

    :meth:`log_prob` is exact (one-dimensional quadrature); :meth:`mc_probability` is the
    Monte Carlo estimate (3.12) of the thesis.

    :param torch.Tensor x: Original (malicious) rows, shape ``batch_shape + (D,)``.
    :param callable predict_proba: ``(M, D) -> (M,)`` classifier probabilities :math:`r(z)`.
    :param int n: Attacker budget.
    :param float var: Proportion of the maximum Beta variance, in (0, 1].
    :param callable predict_logit: Alternative to ``predict_proba`` returning log-odds, which
        keeps precision where :math:`r(z)` rounds to 0 or 1.
    :param bool insert: Word insertion (``True``) or deletion (``False``).
    """

    arg_constraints = {}
    support = constraints.independent(constraints.boolean, 1)

    def __init__(
        self,
        x,
        predict_proba=None,
        n=2,
        var=0.1,
        *,
        predict_logit=None,
        insert=True,
        validate_args=None,
    ):
        check_binary(x)
        if x.dim() < 1:
            raise ValueError("x must have a feature dimension")
        check_budget(n, x.shape[-1])
        check_var(var)
        if (predict_proba is None) == (predict_logit is None):
            raise ValueError("give exactly one of predict_proba and predict_logit")
        self.x, self.n, self.var, self.insert = x, n, var, insert
        self.predict_proba, self.predict_logit = predict_proba, predict_logit
        super().__init__(x.shape[:-1], x.shape[-1:], validate_args=validate_args)

    def _logit(self, z):
        if self.predict_logit is not None:
            return torch.as_tensor(self.predict_logit(z), device=z.device)
        return torch.logit(torch.as_tensor(self.predict_proba(z), device=z.device).double())

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        return type(self)(
            self.x.expand(batch_shape + self.event_shape),
            self.predict_proba,
            self.n,
            self.var,
            predict_logit=self.predict_logit,
            insert=self.insert,
            validate_args=self._validate_args if _instance is None else None,
        )

    def sample(self, sample_shape=torch.Size()):
        rows = []
        for x in self.x.reshape(-1, self.x.shape[-1]):
            candidates = attack_candidates(x, self.n, self.insert)
            alpha, beta = beta_concentrations(self._logit(candidates), self.var)
            rows.append(candidates[dist.Beta(alpha, beta).sample(sample_shape).argmin(-1)])
        return torch.stack(rows, -2).reshape(self._extended_shape(sample_shape))

    def _per_observation(self, value, fn, num_outputs):
        # Rows sharing an observation share the quadrature nodes of its Beta: group them.
        value, x = torch.broadcast_tensors(value.to(self.x.dtype), self.x)
        flat_value, flat_x = value.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1])
        unique, inverse = torch.unique(flat_value, dim=0, return_inverse=True)
        dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
        outputs = [x.new_empty(flat_x.shape[0], dtype=dtype) for _ in range(num_outputs)]
        for k, x_prime in enumerate(unique):
            rows = inverse == k
            for out, part in zip(outputs, fn(x_prime, flat_x[rows].to(dtype))):
                out[rows] = part
        return [out.reshape(value.shape[:-1]) for out in outputs]

    def log_prob(self, value):
        """Exact :math:`\\log p_C(x' = \\text{value} \\mid x, y_1)` by quadrature."""
        if self._validate_args:
            self._validate_sample(value)
        (log_prob,) = self._per_observation(
            value,
            lambda x_prime, x: (
                attack_log_probs(x_prime, x, self._logit, self.n, self.var, self.insert),
            ),
            1,
        )
        return log_prob

    def mc_probability(self, x_prime, num_samples=1000):
        """
        The Monte Carlo estimate (3.12) of :math:`p_C(x' \\mid x, y_1)` with ``num_samples``
        draws :math:`(P^A_z)_z`.

        :returns: ``(estimate, stderr)``, each shaped ``batch_shape``.
        """
        num_samples = check_int(num_samples, "num_samples", low=1)
        return tuple(
            self._per_observation(
                x_prime,
                lambda v, x: attack_mc_probs(
                    v, x, self._logit, self.n, self.var, num_samples, self.insert
                ),
                2,
            )
        )


class ACRA:
    """
    Adversarial classification risk analysis for a generative classifier (Algorithm 3.1,
    thesis eqs. 3.8-3.9). On observing :math:`x'` the defender uses

    .. math:: p_C(x' \\mid y_1) = \\sum_{x \\in \\mathcal X'(x')} p_C(x' \\mid x, y_1)\\,
        p_C(x \\mid y_1), \\qquad p_C(x' \\mid y_0) = p_C(x = x' \\mid y_0),

    (integrity attacks leave innocent instances untouched) and picks the class of maximum
    posterior expected utility. :math:`\\mathcal X'(x')` is enumerated exactly for n-GWI.

    Methods for the sum over :math:`\\mathcal X'(x')`:

    * ``"exact"``: every term, :math:`p_C(x' \\mid x, y_1)` by quadrature.
    * ``"mc"``: every term, :math:`p_C(x' \\mid x, y_1)` by the ``num_mc``-draw Monte Carlo
      estimate (3.12), as in the thesis.
    * ``"sequential"``: terms in decreasing order of :math:`p_C(x \\mid y_1)`, stopping once
      the decision is settled: with partial sum :math:`S_k` and remaining prior mass
      :math:`R_k = \\sum_{\\text{rest}} p_C(x \\mid y_1)`, the sum lies in
      :math:`[S_k, S_k + R_k]` because :math:`p_C(x' \\mid x, y_1) \\le 1`, and the expected
      utility difference is linear in it. Decisions equal ``"exact"``; :meth:`predict_proba`
      returns the posterior of :math:`S_k`, a lower bound on the exact one.
    * ``"importance"``: ``num_proposals`` originating instances drawn from
      :math:`q(x) \\propto p_C(x \\mid y_1)` on :math:`\\mathcal X'(x')` (the :meth:`guide`) weigh
      the :meth:`model` with Pyro's importance sampling; the estimate of the sum is unbiased.

    :param generative_classifier: Fitted model with ``log_joint(x) -> (..., 2)`` returning
        :math:`\\log p_C(x \\mid y) + \\log p_C(y)`, e.g.
        :class:`~pyro_ext.ara.naive_bayes.BernoulliNaiveBayes`.
    :param int n: Attacker budget (words inserted).
    :param float var: Attacker uncertainty, a proportion of the maximum Beta variance.
    :param int num_mc: Monte Carlo draws ``K`` of eq. (3.12) (``method="mc"``).
    :param utility: ``(2, 2)`` matrix, ``utility[i, j]`` the defender's utility of deciding
        ``i`` when the class is ``j``; default the 0-1 utility.
    :param str method: One of ``"exact"``, ``"mc"``, ``"sequential"``, ``"importance"``.
    :param int num_proposals: Importance samples per observed row (``method="importance"``).
    """

    def __init__(
        self,
        generative_classifier,
        n=2,
        var=0.1,
        num_mc=1000,
        utility=None,
        method="exact",
        num_proposals=100,
    ):
        if not callable(getattr(generative_classifier, "log_joint", None)):
            raise ValueError("generative_classifier must provide log_joint(x) -> (..., 2)")
        n = check_int(n, "attacker budget n", low=0)
        var = check_var(var)
        num_mc = check_int(num_mc, "num_mc", low=1)
        num_proposals = check_int(num_proposals, "num_proposals", low=1)
        check_choice(method, "method", METHODS)
        utility = torch.eye(2) if utility is None else torch.as_tensor(utility)
        if utility.shape != (2, 2) or not torch.isfinite(utility).all():
            raise ValueError("utility must be a finite (2, 2) matrix")
        self.classifier = generative_classifier
        self.n, self.var, self.num_mc, self.method = n, var, num_mc, method
        self.num_proposals = num_proposals
        self.utility = utility.double()

    def _logit(self, z):
        log_joint = self.classifier.log_joint(z)
        return log_joint[..., 1] - log_joint[..., 0]

    def attacker(self, x):
        """The attacker model :math:`p_C(x' \\mid x, y_1)` for original rows ``x``."""
        return RandomWordInsertionAttack(x, n=self.n, var=self.var, predict_logit=self._logit)

    def _originals(self, x_observed):
        originals = originating_instances(x_observed, self.n)
        return originals, self.classifier.log_joint(originals)[:, 1]

    def model(self, x_observed):
        """
        The malicious branch of eq. (3.8) as a Pyro program: the clean instance ``x`` is drawn
        from :math:`p_C(x, y_1)` restricted to :math:`\\mathcal X'(x')`, then ``x'`` is observed
        from the attacker model. Its evidence is :math:`p_C(y_1)\\, p_C(x' \\mid y_1)`.
        """
        originals, log_joint = self._originals(x_observed)
        pyro.factor("restricted_mass", log_joint.logsumexp(0))
        index = pyro.sample("x", dist.Categorical(logits=log_joint))
        pyro.sample("x_prime", self.attacker(originals[index]), obs=x_observed)

    def guide(self, x_observed):
        """Proposes originating instances :math:`x \\propto p_C(x \\mid y_1)` on
        :math:`\\mathcal X'(x')`."""
        _, log_joint = self._originals(x_observed)
        pyro.sample("x", dist.Categorical(logits=log_joint))

    def _log_malicious(self, x_observed, originals, log_joint, log_innocent):
        if self.method == "importance":
            log_weights, _, _ = vectorized_importance_weights(
                self.model,
                self.guide,
                x_observed,
                num_samples=self.num_proposals,
                max_plate_nesting=0,
            )
            return log_weights.logsumexp(0) - math.log(self.num_proposals)
        if self.method == "sequential":
            return self._log_malicious_sequential(x_observed, originals, log_joint, log_innocent)
        if self.method == "mc":
            estimate, _ = attack_mc_probs(
                x_observed, originals, self._logit, self.n, self.var, self.num_mc
            )
            log_attack = estimate.log()
        else:
            log_attack = attack_log_probs(x_observed, originals, self._logit, self.n, self.var)
        return (log_joint + log_attack).logsumexp(0)

    def _log_malicious_sequential(self, x_observed, originals, log_joint, log_innocent):
        log_joint, order = log_joint.double().sort(descending=True)
        originals = originals[order]
        # Common scale so that the terms and the innocent evidence are O(1).
        shift = torch.maximum(log_joint.logsumexp(0), log_innocent.double())
        mass = (log_joint - shift).exp()
        remaining = mass.flip(0).cumsum(0).flip(0).tolist() + [0.0]
        innocent = float((log_innocent - shift).exp())
        u = self.utility.tolist()

        def gain(total):
            # Expected utility of deciding 1 minus deciding 0, linear in the malicious sum.
            return (u[1][1] - u[0][1]) * total + (u[1][0] - u[0][0]) * innocent

        total, start, size = 0.0, 0, 1
        while start < len(mass):
            stop = min(start + size, len(mass))
            log_attack = attack_log_probs(
                x_observed, originals[start:stop], self._logit, self.n, self.var
            )
            total += float((mass[start:stop] * log_attack.double().exp()).sum())
            low, high = gain(total), gain(total + remaining[stop])
            # Geometric batches keep the loop short and each quadrature call vectorised.
            start, size = stop, 2 * size
            if (low > 0) == (high > 0):
                break
        return torch.tensor(total, dtype=torch.float64).log().to(log_joint) + shift

    def log_evidence(self, x_observed):
        """
        :param torch.Tensor x_observed: Observed (possibly attacked) binary rows ``(N, D)``.
        :returns: :math:`\\log p_C(y) + \\log p_C(X' = x' \\mid y)` for ``y = 0, 1``, ``(N, 2)``.
        """
        check_binary(x_observed)
        if x_observed.dim() != 2:
            raise ValueError(f"x must have shape (N, D), got {tuple(x_observed.shape)}")
        check_budget(self.n, x_observed.shape[-1])
        rows = []
        for x_prime in x_observed:
            log_innocent = self.classifier.log_joint(x_prime)[0]
            originals, log_joint = self._originals(x_prime)
            log_malicious = self._log_malicious(x_prime, originals, log_joint, log_innocent)
            rows.append(torch.stack([log_innocent, log_malicious.to(log_innocent)]))
        return torch.stack(rows) if rows else x_observed.new_zeros((0, 2))

    def predict_proba(self, x_observed):
        """
        :returns: The defender's :math:`p_C(y_1 \\mid X' = x')`, accounting for the attack,
            shape ``(N,)``.
        """
        return self.log_evidence(x_observed).softmax(-1)[:, 1]

    def predict(self, x_observed):
        """:returns: Decisions maximising posterior expected utility (Algorithm 3.1), ``(N,)``."""
        posterior = self.log_evidence(x_observed).softmax(-1).double()
        expected_utility = posterior @ self.utility.to(posterior.device).T
        return expected_utility.argmax(-1)
