r"""
Exact inference in discrete hidden Markov models.

The latent chain :math:`z_{1:T}` is marginalised exactly, as in thesis §2.4.2 / appendix
2.B: the forward–backward algorithm (Rabiner 1989) gives the likelihood, filtering and
smoothing marginals, the Viterbi algorithm (Viterbi 1967) the most probable path, and
forward-filter backward-sample (FFBS; Frühwirth-Schnatter 1994, Carter & Kohn 1994) exact
posterior path draws.

Two engines evaluate them, chosen per call:

* **compiled sequential kernels** (CPU tensors, with numba installed: the ``fast`` extra;
  :mod:`._hmm_sequential`): the textbook recursions as one machine-code loop over time,
  ``O(T K^2)`` work and no per-step dispatch. The likelihood, filter, smoother, expected
  statistics and Viterbi use them; the likelihood's gradient is the expected counts, by the
  same kernels. On one CPU thread this is the faster engine at every size measured
  (``benchmarks/results/timeseries_speed.md``).
* **scans** (CUDA, ``torch.func`` transforms, ``torch.compile``, no numba, gradients of
  the other queries, or inside :func:`sequential_kernels(False)
  <pyro_ext.timeseries.sequential_kernels>`): every recursion as an associative scan with
  :math:`O(\log T)` depth by :mod:`pyro_ext.ops.scan` over the semirings of
  :mod:`pyro_ext.ops.semiring`, no Python loop over time. On long series the likelihood
  and Viterbi instead advance ``~sqrt(T)`` chunks together (``~sqrt(T)`` Python steps):
  chunk products for the likelihood, and speculative max-product chunks with fix-up passes
  (rank convergence) for Viterbi, ``O(T K^2)`` work.

Both give the same answers to round-off (the kernels add in float64 whatever the dtype);
``tests/timeseries/test_hmm_sequential.py`` holds them to each other and to enumeration.

Conventions (all functions are batched over leading dims ``...``, differentiable, and
follow the device and dtype of their inputs):

* ``init_logits`` ``(..., K)``: distribution of the **first** hidden state :math:`z_1`
  (the hmmlearn/dynamax convention). :class:`pyro.distributions.DiscreteHMM` instead
  takes the state *before* the first transition; ``DiscreteHMM(init, trans, obs)`` equals
  our model with ``init' = logsumexp(init[:, None] + trans, 0)``.
* ``trans_logits`` ``(..., K, K)``, rows indexing the from-state, or time-varying
  ``(..., T-1, K, K)`` where entry ``t`` moves :math:`z_{t+1} \to z_{t+2}`. It is read
  as time-varying exactly when ``trans_logits.dim() == obs_log_probs.dim() + 1``.
* ``obs_log_probs`` ``(..., T, K)``: :math:`\log p(x_t \mid z_t = k)`.
* Logits are normalised with ``log_softmax`` along the last dim, so unnormalised logits
  are fine; ``-inf`` marks impossible states/transitions.
* ``mask`` ``(..., T)`` bool, optional: ``False`` marks a missing observation, whose
  emission term is dropped (the time step itself stays). NaN in ``obs_log_probs`` is an
  error unless masked.
"""

import functools
import math
from typing import NamedTuple

import torch
from pyro.distributions import TorchDistribution, constraints
from torch.distributions import transform_to

from ..ops import scan, semiring
from ..ops.semiring import finite_min
from ..ops.validation import broadcast_shapes, check_int, values_checked
from . import _hmm_sequential as sequential

__all__ = [
    "HMMExpectedStatistics",
    "HiddenMarkovDistribution",
    "check_stochastic_matrix",
    "hmm_expected_statistics",
    "hmm_filter",
    "hmm_log_likelihood",
    "hmm_predict",
    "hmm_sample_paths",
    "hmm_smooth",
    "hmm_viterbi",
]


# ---------------------------------------------------------------- validation


def check_stochastic_matrix(name, probs, atol=None):
    """
    Check that ``probs`` ``(..., K)`` holds probability rows: finite, non-negative, each
    summing to one within ``atol`` (default: square root of the dtype's epsilon).

    :returns: ``probs`` as a tensor.
    :raises ValueError: naming ``name``.
    """
    probs = torch.as_tensor(probs)
    if probs.dim() < 1 or probs.shape[-1] < 1:
        raise ValueError(f"{name} must have a last dim of size >= 1, got {tuple(probs.shape)}")
    if not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating point tensor, got {probs.dtype}")
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name} contains NaN or infinite probabilities")
    if bool((probs < 0).any()):
        raise ValueError(f"{name} contains negative probabilities")
    if atol is None:
        atol = torch.finfo(probs.dtype).eps ** 0.5
    err = (probs.sum(-1) - 1).abs().max()
    if float(err) > atol:
        raise ValueError(f"rows of {name} must sum to one; the worst is off by {float(err):.3g}")
    return probs


def _check_tensor(name, x, min_dim, shape_hint):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating point tensor, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have shape {shape_hint}, got {tuple(x.shape)}")


def _check_no_nan_or_posinf(name, x):
    if bool(torch.isnan(x).any()):
        raise ValueError(f"{name} contains NaN")
    if bool(torch.isposinf(x).any()):
        raise ValueError(f"{name} contains +inf")


def _no_nan_or_posinf(x):
    """Whether ``x`` holds neither NaN nor +inf, in one pass: its sum is NaN or +inf
    exactly then (or on overflow, which only sends the caller to the exact checks)."""
    total = float(x.detach().sum())
    return total == total and total != math.inf


def _check_some_state_possible(name, x):
    """Every row of log-probabilities ``x`` ``(..., K)`` allows at least one state."""
    dead = torch.isneginf(x).all(-1)
    if bool(dead.any()):
        index = tuple(int(i) for i in dead.nonzero()[0])
        if name == "init_logits":
            where = f"init_logits[{', '.join(map(str, index))}]" if index else "init_logits"
            raise ValueError(
                f"{where} is -inf for every state: the first hidden state must have at least "
                "one possible value (a row of -inf logits cannot be normalised)"
            )
        raise ValueError(
            f"trans_logits[{', '.join(map(str, index))}] is -inf for every next state: each "
            f"from-state (here state {index[-1]}) needs at least one possible transition (a row "
            "of -inf logits cannot be normalised); give it a finite logit, e.g. 0 for a "
            "self-transition"
        )


def _check_evidence(problem, log_norm, log_norms=None):
    """
    Raise if the observations have probability zero, which leaves posterior queries
    undefined. ``log_norm`` ``(...)`` is the final log normaliser (or Viterbi score);
    ``log_norms`` ``(T, ...)``, the filter's running ones, locate the first impossible time
    step (computed here if not given). Follows the validation switch.
    """
    if not values_checked() or not bool(torch.isneginf(log_norm).any()):
        return
    if log_norms is None:
        log_norms = problem.forward()[1]
    impossible = torch.isneginf(log_norms)  # once -inf, -inf at every later step
    first = (~impossible).sum(0).flatten()  # first impossible step per batch element
    flat = int(first.argmin())
    step = int(first[flat])
    if step >= problem.duration:  # underflow in one pass only; report the last step
        step = problem.duration - 1
    batch = ""
    if len(problem.batch_shape):
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), problem.batch_shape))
        batch = f" of batch element {index}"
    raise ValueError(
        f"obs_log_probs: the observation at time step {step} (0-based){batch} is impossible "
        "under every state the chain can be in at that step (the observations up to it have "
        "probability 0), so the posterior over the hidden states is undefined; check the "
        "emission parameters and trans_logits, or mark the observation missing with mask=False"
    )


def _checked_filter(problem):
    """The filtered probabilities ``(T, ..., K)`` of ``problem``, after
    :func:`_check_evidence` on the filter's log normalisers."""
    if problem.sequential():
        filtered, log_norms = sequential.filtered(*problem.flat())
        dtype, batch = problem.obs.dtype, problem.batch_shape
        filtered = filtered.to(dtype).movedim(1, 0).reshape(problem.obs.shape)
        log_norms = log_norms.to(dtype).movedim(1, 0).reshape((problem.duration,) + batch)
    else:
        filtered, log_norms = problem.forward()
    _check_evidence(problem, log_norms[-1], log_norms)
    return filtered


def _as_dtype(x, dtype):
    # Skips the call where nothing changes: every call of the functions below passes here,
    # and a small series' whole evaluation takes tens of microseconds.
    return x if x.dtype == dtype else x.to(dtype)


def _expanded(x, shape):
    return x if x.shape == shape else x.expand(shape)


class _Problem:
    """Validated, normalised inputs in the engine's time-first layout."""

    def __init__(self, init_logits, trans_logits, obs_log_probs, mask):
        _check_tensor("init_logits", init_logits, 1, "(..., K)")
        _check_tensor("trans_logits", trans_logits, 2, "(..., K, K) or (..., T-1, K, K)")
        _check_tensor("obs_log_probs", obs_log_probs, 2, "(..., T, K)")
        num_states = init_logits.shape[-1]
        if num_states < 1:
            raise ValueError("init_logits must have K >= 1 states, got K = 0")
        if trans_logits.shape[-2:] != (num_states, num_states):
            raise ValueError(
                f"trans_logits must end in (K, K) = ({num_states}, {num_states}) to match "
                f"init_logits, got {tuple(trans_logits.shape)}"
            )
        if obs_log_probs.shape[-1] != num_states:
            raise ValueError(
                f"obs_log_probs must end in K = {num_states} to match init_logits, "
                f"got {tuple(obs_log_probs.shape)}"
            )
        duration = obs_log_probs.shape[-2]
        if duration < 1:
            raise ValueError("obs_log_probs has an empty time axis (T = 0)")
        if trans_logits.dim() > obs_log_probs.dim() + 1:
            raise ValueError(
                f"trans_logits has more dims ({trans_logits.dim()}) than a time-varying "
                f"(..., T-1, K, K) matching obs_log_probs ({obs_log_probs.dim()} dims) allows"
            )
        self.time_varying = trans_logits.dim() == obs_log_probs.dim() + 1
        if self.time_varying and trans_logits.shape[-3] != duration - 1:
            raise ValueError(
                f"time-varying trans_logits must have T-1 = {duration - 1} steps on dim -3, "
                f"got {tuple(trans_logits.shape)}"
            )
        # Checks on tensor values follow torch.distributions' global validation switch
        # (``pyro.enable_validation``): they branch on data, which torch.func.vmap cannot
        # trace, so vectorised samplers turn validation off while they evaluate.
        check_values = values_checked()
        if check_values:
            # One reduction per tensor decides; the checks that word an error run only
            # when it finds something.
            for name, x in (("init_logits", init_logits), ("trans_logits", trans_logits)):
                # The rows' maxima sum to a finite number unless some row holds NaN or +inf
                # or is all -inf (or on overflow, which only sends us to the exact checks).
                if not math.isfinite(float(x.detach().amax(-1).sum())):
                    _check_no_nan_or_posinf(name, x)
                    _check_some_state_possible(name, x)
            obs_ok = _no_nan_or_posinf(obs_log_probs)
            if not obs_ok and bool(torch.isposinf(obs_log_probs).any()):
                raise ValueError("obs_log_probs contains +inf")
        shapes = [init_logits.shape[:-1], trans_logits.shape[: -3 if self.time_varying else -2]]
        shapes.append(obs_log_probs.shape[:-2])
        if mask is not None:
            mask = self._check_mask(mask, duration)
            shapes.append(mask.shape[:-1])
            if check_values and bool((torch.isnan(obs_log_probs) & mask.unsqueeze(-1)).any()):
                raise ValueError("obs_log_probs contains NaN at observed (mask=True) entries")
            obs_log_probs = obs_log_probs.masked_fill(~mask.unsqueeze(-1), 0.0)
        elif check_values and not obs_ok and bool(torch.isnan(obs_log_probs).any()):
            raise ValueError("obs_log_probs contains NaN; mark missing entries with mask=False")
        if all(len(shape) == 0 for shape in shapes):
            batch = torch.Size()  # the common unbatched call, without the general rule's cost
        else:
            try:
                batch = broadcast_shapes(*shapes)
            except RuntimeError as e:
                raise ValueError(f"batch shapes of the arguments do not broadcast: {e}") from None
        dtype = functools.reduce(
            torch.promote_types, [init_logits.dtype, trans_logits.dtype, obs_log_probs.dtype]
        )
        self.batch_shape = batch
        self.duration = duration
        self.num_states = num_states
        self.log_init = _expanded(
            torch.log_softmax(_as_dtype(init_logits, dtype), -1), batch + (num_states,)
        )
        log_trans = torch.log_softmax(_as_dtype(trans_logits, dtype), -1)
        if self.time_varying:
            log_trans = _expanded(log_trans, batch + (duration - 1, num_states, num_states))
            log_trans = log_trans.movedim(-3, 0)
        else:
            log_trans = _expanded(log_trans, batch + (num_states, num_states))
        self.log_trans = log_trans  # (T-1, *batch, K, K) or (*batch, K, K)
        obs = _expanded(_as_dtype(obs_log_probs, dtype), batch + (duration, num_states))
        self.obs = obs.movedim(-2, 0)  # (T, *batch, K)

    @classmethod
    def from_flat(cls, log_init, log_trans, obs):
        """A problem over normalised, batch-flattened inputs ``(B, K)``, ``(B, 1 | T-1, K,
        K)``, ``(B, T, K)`` (:meth:`flat`'s layout), without validation."""
        self = cls.__new__(cls)
        self.duration, self.num_states = obs.shape[1:]
        self.time_varying = log_trans.shape[1] != 1
        self.batch_shape = obs.shape[:1]
        self.log_init = log_init
        self.log_trans = log_trans.movedim(1, 0) if self.time_varying else log_trans[:, 0]
        self.obs = obs.movedim(1, 0)
        return self

    def flat(self):
        """``(log_init (B, K), log_trans (B, 1 | T-1, K, K), obs (B, T, K))``: the batch
        flattened and time after it, the layout of the compiled sequential kernels."""
        num_states, size = self.num_states, self.batch_shape.numel()
        log_init = self.log_init.reshape(size, num_states)
        if self.time_varying:
            log_trans = self.log_trans.movedim(0, -3)
            log_trans = log_trans.reshape((size, self.duration - 1, num_states, num_states))
        else:
            log_trans = self.log_trans.reshape(size, 1, num_states, num_states)
        obs = self.obs.movedim(0, -2).reshape(size, self.duration, num_states)
        return log_init, log_trans, obs

    def tensors(self):
        return self.log_init, self.log_trans, self.obs

    def sequential(self, differentiable=False):
        """Whether the compiled sequential kernels (:mod:`._hmm_sequential`) evaluate this
        problem: on CPU, untraced, with numba installed; ``differentiable`` says whether the
        caller has a sequential gradient (else a graph needing one goes to the scans)."""
        tensors = self.tensors()
        if not differentiable and torch.is_grad_enabled():
            if any(t.requires_grad for t in tensors):
                return False
        return sequential.available(*tensors)

    @staticmethod
    def _check_mask(mask, duration):
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError("mask must be a bool tensor of shape (..., T)")
        if mask.dim() < 1 or mask.shape[-1] != duration:
            raise ValueError(
                f"mask must have shape (..., T) with T = {duration}, got {tuple(mask.shape)}"
            )
        return mask

    def log_first(self):
        return self.log_init + self.obs[0]

    def log_factors(self):
        """``(T-1, *batch, K, K)`` log factors ``log A_t[j, k] + log p(x_t | k)``."""
        return self.log_trans + self.obs[1:].unsqueeze(-2)

    def forward(self):
        """Filtered probabilities and log normalisers, both time-first."""
        return scan.vector_scan(
            semiring.scaled_vector(self.log_first()),
            semiring.scaled_matrix(self.log_factors()),
            semiring.scaled_vec_mat,
            semiring.scaled_mat_mat,
        )


def _chunk_length(num_factors):
    """Steps per chunk of the chunked passes: about sqrt(n) balances Python steps and work."""
    return max(1, int(math.isqrt(max(num_factors - 1, 0))) + 1)


def _rescale_interval(log_trans, length):
    """How many factors ``A_t diag(e_t)`` the chunked pass may multiply in before it rescales
    the rows of its products to max one, keeping them as far from under- and overflow as a
    rescale after every factor would.

    With ``e_t`` scaled to max one, a row with max one keeps a max of at least
    ``min(A)`` after one factor (the entry ``A[k*, j*] e_t[j*]``) and at most the largest
    column sum of ``A``; ``r`` factors move it by at most those powers.  ``r`` keeps both
    within a tenth of the dtype's exponent range (rows above ``1e-31`` in float64, ``2e-4``
    in float32).  Structural zeros in ``A`` give 1: rescale after every factor.
    """
    info = torch.finfo(log_trans.dtype)
    log_trans = log_trans.detach()
    log_min = float(log_trans.amin())
    log_col = float(torch.logsumexp(log_trans, -2).amax())
    budget = 0.1 * math.log(info.tiny)  # negative
    down = math.inf if log_min == 0 else budget / log_min
    up = math.inf if log_col <= 0 else -budget / log_col
    if not math.isfinite(log_min):
        return 1
    return int(max(1, min(down, up, length)))


def _chunked_log_likelihood(problem):
    """
    ``log p(x)`` by products of chunks of factors, all chunks advanced together.

    The factor of step ``t`` is ``A_t diag(e_t)`` with ``e_t`` the emission likelihoods
    scaled by their maximum, so each step is one matrix product with ``A`` for every chunk
    at once (a single GEMM for time-homogeneous ``A``), with rows rescaled to max one. The
    chunk products, in :func:`~pyro_ext.ops.semiring.scaled_matrix` form, are then reduced by
    the tree.
    """
    obs = problem.obs
    num_factors = problem.duration - 1
    vector = semiring.scaled_vector(problem.log_first())
    length = _chunk_length(num_factors)
    num_chunks, rem = divmod(num_factors, length)
    log_trans = problem.log_trans
    if rem:
        # The leading remainder (fewer than ``length`` factors) goes into the vector.
        lead = log_trans[:rem] if problem.time_varying else log_trans
        vector = scan.vector_reduce(
            vector,
            semiring.scaled_matrix(lead + obs[1 : 1 + rem].unsqueeze(-2)),
            semiring.scaled_vec_mat,
            semiring.scaled_mat_mat,
        )
    if num_chunks == 0:
        return vector[1]
    tiny = torch.finfo(obs.dtype).tiny
    obs = obs[1 + rem :].reshape((num_chunks, length) + obs.shape[1:])
    obs_max = obs.amax(-1, keepdim=True)
    emit = torch.exp(obs - obs_max.clamp(min=finite_min(obs_max)))
    trans = torch.exp(log_trans)
    if problem.time_varying:
        trans = trans[rem:].reshape((num_chunks, length) + trans.shape[1:])
        steps = [trans[:, j] for j in range(length)]
    else:
        steps = [trans] * length
    interval = _rescale_interval(log_trans, length)
    mat = steps[0] * emit[:, 0].unsqueeze(-2)
    log_rows = None
    unscaled = 1  # factors multiplied in since the rows last had max one
    for j in range(1, length + 1):
        if unscaled == interval or j == length:
            row_max = mat.amax(-1, keepdim=True)
            mat = mat / row_max.clamp(min=tiny)
            log_row = torch.log(row_max)
            log_rows = log_row if log_rows is None else log_rows + log_row
            unscaled = 0
        if j < length:
            mat = torch.matmul(mat, steps[j]) * emit[:, j].unsqueeze(-2)
            unscaled += 1
    log_rows = log_rows.squeeze(-1)
    shift = log_rows.amax(-1)
    rows = log_rows - shift.clamp(min=finite_min(shift)).unsqueeze(-1)
    offset = shift + obs_max.squeeze(-1).sum(1)
    _, log_norm = scan.vector_reduce(
        vector, (mat, rows, offset), semiring.scaled_vec_mat, semiring.scaled_mat_mat
    )
    return log_norm


def _maxplus_step(x, log_trans_t, obs):
    """
    One max-product step of normalised messages ``x`` with transposed (to, from) log
    transitions: ``(new, backpointers, shift)``. The reduction runs over the contiguous dim.
    """
    scores, pointers = (x.unsqueeze(-2) + log_trans_t).max(-1)
    scores = scores + obs
    shift = scores.amax(-1, keepdim=True)
    return scores - shift.clamp(min=finite_min(shift)), pointers, shift.squeeze(-1)


def _speculative_viterbi(problem, max_fixups=4):
    """
    Max-product forward messages by chunks run in parallel from arbitrary starts, then
    fix-up passes (Maleki, Musuvathi & Mytkowicz 2014, "Parallelizing dynamic programming
    through rank convergence"): max-product messages from different starts become parallel
    (equal once shifted to max 0) after a few steps, so each chunk is recomputed from its
    predecessor's end only until it agrees with what it already holds. ``O(T K^2)`` work.

    :returns: ``(delta, pointers, shifts, first_shift)`` time-first (``n`` factors, padded
        at the end to whole chunks), or ``None`` if the messages do not converge within
        ``max_fixups`` passes.
    """
    obs = problem.obs
    num_factors = problem.duration - 1
    length = _chunk_length(num_factors)
    num_chunks = -(-num_factors // length)
    pad = num_chunks * length - num_factors
    first, first_shift = semiring.maxplus_vector(problem.log_first())
    obs = obs[1:]
    log_trans = problem.log_trans.transpose(-1, -2).contiguous()
    if pad:
        # Padding at the end cannot change any earlier message.
        obs = torch.cat([obs, obs.new_zeros((pad,) + obs.shape[1:])])
        if problem.time_varying:
            log_trans = torch.cat([log_trans, log_trans[-1:].expand((pad,) + log_trans.shape[1:])])
    obs = obs.reshape((num_chunks, length) + obs.shape[1:])
    if problem.time_varying:
        log_trans = log_trans.reshape((num_chunks, length) + log_trans.shape[1:])
        steps = [log_trans[:, j] for j in range(length)]
    else:
        steps = [log_trans] * length
    delta = obs.new_empty(obs.shape)
    pointers = torch.empty(obs.shape, dtype=torch.long, device=obs.device)
    shifts = obs.new_empty(obs.shape[:-1])
    x = torch.zeros_like(obs[:, 0])
    x[0] = first
    for j in range(length):
        x, pointers[:, j], shifts[:, j] = _maxplus_step(x, steps[j], obs[:, j])
        delta[:, j] = x
    if num_chunks == 1:
        return delta, pointers, shifts, first_shift
    tol = 64 * torch.finfo(obs.dtype).eps
    for _ in range(max_fixups):
        x = delta[:-1, -1].clone()
        active = None  # chunks whose incoming message changed: all of them at the first step
        for j in range(length):
            step = steps[j][1:] if problem.time_varying else steps[j]
            x, ptr, shift = _maxplus_step(x, step, obs[1:, j])
            old = delta[1:, j]
            same = (x == old) | ((x - old).abs() <= tol * (1 + old.abs()))
            same = same.flatten(1).all(-1)
            # The step where a chunk's message comes back into line still takes its
            # backpointers and shift from the corrected incoming message: the same
            # normalised message can come from a different best predecessor.
            if active is None:
                delta[1:, j], pointers[1:, j], shifts[1:, j] = x, ptr, shift
            else:
                sel = active.view(active.shape + (1,) * (x.dim() - 1))
                delta[1:, j] = torch.where(sel, x, old)
                pointers[1:, j] = torch.where(sel, ptr, pointers[1:, j])
                shifts[1:, j] = torch.where(sel.squeeze(-1), shift, shifts[1:, j])
            active = ~same if active is None else active & ~same
            if not bool(active.any()):
                return delta, pointers, shifts, first_shift
    return None


# ---------------------------------------------------------------- functional floor


def hmm_log_likelihood(
    init_logits: torch.Tensor,
    trans_logits: torch.Tensor,
    obs_log_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    :math:`\\log p(x_{1:T})`, shape ``(...)``. On CPU with numba installed (the ``fast``
    extra), the scaled forward algorithm as one compiled loop over time, differentiated by
    the expected counts (:mod:`._hmm_sequential`); elsewhere (CUDA, ``torch.func``,
    ``torch.compile``, no numba) products of ``~sqrt(T)`` chunks of factors, all chunks
    advanced together, then a pairwise tree reduction (the tree alone for short series).
    """
    problem = _Problem(init_logits, trans_logits, obs_log_probs, mask)
    if problem.sequential(differentiable=True):
        log_norm = sequential.sequential_log_likelihood(*problem.flat(), _flat_log_likelihood)
        return log_norm.reshape(problem.batch_shape)
    return _scan_log_likelihood(problem)


def _scan_log_likelihood(problem):
    if (problem.duration - 1) * problem.num_states >= 4096:
        # Below this the tree reduction's fewer Python steps measured faster.
        return _chunked_log_likelihood(problem)
    _, log_norm = scan.vector_reduce(
        semiring.scaled_vector(problem.log_first()),
        semiring.scaled_matrix(problem.log_factors()),
        semiring.scaled_vec_mat,
        semiring.scaled_mat_mat,
    )
    return log_norm


def _flat_log_likelihood(log_init, log_trans, obs):
    """The scans' ``log p(x)`` of :meth:`_Problem.flat` inputs: the sequential path's
    second derivatives."""
    return _scan_log_likelihood(_Problem.from_flat(log_init, log_trans, obs))


def hmm_filter(
    init_logits: torch.Tensor,
    trans_logits: torch.Tensor,
    obs_log_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Filtered probabilities :math:`p(z_t \\mid x_{1:t})`, shape ``(..., T, K)``."""
    problem = _Problem(init_logits, trans_logits, obs_log_probs, mask)
    filtered = _checked_filter(problem)
    return filtered.movedim(0, -2)


def _forward_backward(problem):
    """Filtered probabilities and scaled backward messages, both ``(T, ..., K)``: a forward
    prefix scan and a backward (suffix) scan."""
    # beta_t^T = 1^T X_T^T ... X_{t+1}^T: a prefix scan over the reversed, transposed factors.
    # Both scans run as one, stacked on a new leading batch dim: half the Python steps
    # (each level's products are tiny for a small K, so their count is the cost).
    log_factors = problem.log_factors()
    first = problem.log_first()
    uniform = torch.zeros_like(first)
    stacked_factors = torch.stack([log_factors, log_factors.transpose(-1, -2).flip(0)], 1)
    stacked_start = torch.stack([first, uniform.expand_as(first)])
    probs, log_norms = scan.vector_scan(
        semiring.scaled_vector(stacked_start),
        semiring.scaled_matrix(stacked_factors),
        semiring.scaled_vec_mat,
        semiring.scaled_mat_mat,
    )
    filtered, log_norms = probs[:, 0], log_norms[:, 0]
    _check_evidence(problem, log_norms[-1], log_norms)
    beta = probs[:, 1].flip(0)
    return filtered, beta, log_norms[-1]


def hmm_smooth(
    init_logits: torch.Tensor,
    trans_logits: torch.Tensor,
    obs_log_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    Posterior marginals :math:`p(z_t \\mid x_{1:T})`, shape ``(..., T, K)``: a forward
    prefix scan times a backward (suffix) scan, ``alpha_t * beta_t`` renormalised.
    """
    problem = _Problem(init_logits, trans_logits, obs_log_probs, mask)
    if problem.sequential():
        posterior, _, log_norm = sequential.expected_statistics(*problem.flat(), pairs=False)
        _check_sequential_evidence(problem, log_norm)
        return posterior.to(problem.obs.dtype).reshape(problem.batch_shape + posterior.shape[1:])
    filtered, beta, _ = _forward_backward(problem)
    post = filtered * beta
    post = post / post.sum(-1, keepdim=True)
    return post.movedim(0, -2)


def _check_sequential_evidence(problem, log_norm):
    """The kernels' ``log p(x)`` ``(B,)`` as a tensor of the problem's batch shape and dtype,
    after :func:`_check_evidence`."""
    log_norm = log_norm.to(problem.obs.dtype).reshape(problem.batch_shape)
    if values_checked() and bool(torch.isneginf(log_norm).any()):
        _check_evidence(problem, log_norm)
    return log_norm


def _sequential_statistics(problem, trans_logits):
    """:class:`HMMExpectedStatistics` by the compiled forward-backward pass."""
    posterior, pairs, log_norm = sequential.expected_statistics(*problem.flat())
    dtype, batch = problem.obs.dtype, problem.batch_shape
    log_norm = _check_sequential_evidence(problem, log_norm)
    posterior = posterior.to(dtype).reshape(batch + posterior.shape[1:])
    num_states = problem.num_states
    if problem.time_varying:
        pairs = pairs.to(dtype).reshape(batch + (problem.duration - 1, num_states, num_states))
    else:
        pairs = pairs.to(dtype).reshape(batch + (num_states, num_states))
    counts = (
        pairs.sum_to_size(trans_logits.shape)
        if problem.duration > 1
        else pairs.new_zeros(trans_logits.shape)
    )
    return HMMExpectedStatistics(posterior, counts, log_norm)


class HMMExpectedStatistics(NamedTuple):
    r"""
    The expected sufficient statistics of a discrete HMM given its observations (the E-step
    of Baum-Welch).

    :ivar torch.Tensor posterior: :math:`\gamma_t(k) = p(z_t = k \mid x_{1:T})`, shape
        ``(..., T, K)``.
    :ivar torch.Tensor transition_counts: the expected transitions, :math:`\sum_{t<T}
        \xi_t(j, k)` with :math:`\xi_t(j, k) = p(z_t = j, z_{t+1} = k \mid x_{1:T})`,
        summed like ``trans_logits`` broadcasts: ``(K, K)`` for a homogeneous matrix shared
        by a batch of series, ``(..., T-1, K, K)`` for a time-varying one.
    :ivar torch.Tensor log_likelihood: :math:`\log p(x_{1:T})`, shape ``(...)``.
    """

    posterior: torch.Tensor
    transition_counts: torch.Tensor
    log_likelihood: torch.Tensor


def hmm_expected_statistics(
    init_logits: torch.Tensor,
    trans_logits: torch.Tensor,
    obs_log_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> HMMExpectedStatistics:
    r"""
    Posterior marginals, expected transition counts and the log-likelihood in one
    forward-backward pass (arguments as for :func:`hmm_log_likelihood`). The two-slice
    marginals are :math:`\xi_t(j, k) \propto \alpha_t(j) A_t[j, k] p(x_{t+1} \mid k)
    \beta_{t+1}(k)`, normalised per step, from the same scans as :func:`hmm_smooth`.
    """
    problem = _Problem(init_logits, trans_logits, obs_log_probs, mask)
    if problem.sequential():
        return _sequential_statistics(problem, trans_logits)
    filtered, beta, log_likelihood = _forward_backward(problem)
    posterior = filtered * beta
    posterior = posterior / posterior.sum(-1, keepdim=True)
    if problem.duration == 1:
        counts = torch.zeros_like(trans_logits, dtype=posterior.dtype)
        return HMMExpectedStatistics(posterior.movedim(0, -2), counts, log_likelihood)
    # Per step (T-1, *batch, K, K), in log space shifted per step: the normalisation of
    # each two-slice marginal cancels the shifts.
    log_pair = (
        filtered[:-1].clamp_min(1e-300).log().unsqueeze(-1)
        + problem.log_trans
        + (problem.obs[1:] + beta[1:].clamp_min(1e-300).log()).unsqueeze(-2)
    )
    log_pair = log_pair - log_pair.flatten(-2).logsumexp(-1)[..., None, None]
    pair = log_pair.exp()
    if problem.time_varying:
        counts = pair.movedim(0, -3).sum_to_size(trans_logits.shape)
    else:
        counts = pair.sum(0).sum_to_size(trans_logits.shape)
    return HMMExpectedStatistics(posterior.movedim(0, -2), counts, log_likelihood)


def hmm_viterbi(
    init_logits: torch.Tensor,
    trans_logits: torch.Tensor,
    obs_log_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Most probable path and its log joint :math:`\\log p(x_{1:T}, z^*_{1:T})`.

    On the compiled kernels, max-product messages and one backtrack. On the scans, max-plus
    prefix messages give every backpointer in parallel and the path is recovered by pointer
    jumping over the backpointer maps instead of a loop over time.

    :returns: ``(path, log_score)`` with shapes ``(..., T)`` (long) and ``(...)``.
    """
    problem = _Problem(init_logits, trans_logits, obs_log_probs, mask)
    if problem.sequential():
        path, log_score = sequential.viterbi(*problem.flat())
        log_score = log_score.to(problem.obs.dtype).reshape(problem.batch_shape)
        _check_evidence(problem, log_score)
        return path.reshape(problem.batch_shape + (problem.duration,)), log_score
    result = None
    if (problem.duration - 1) * problem.num_states**2 >= 16384:
        # Below this the scan's fewer Python steps measured faster.
        result = _speculative_viterbi(problem)
    if result is not None:
        delta, pointers, shifts, first_shift = result
        num_factors = problem.duration - 1
        delta = delta.flatten(0, 1)[:num_factors]
        pointers = pointers.flatten(0, 1)[:num_factors]
        log_score = first_shift + shifts.flatten(0, 1)[:num_factors].sum(0)
        _check_evidence(problem, log_score)
        path = semiring.compose_maps(delta[-1].argmax(-1), pointers.flip(0)).flip(0)
        return path.movedim(0, -1), log_score
    delta, offset = scan.vector_scan(
        semiring.maxplus_vector(problem.log_first()),
        semiring.maxplus_matrix(problem.log_factors()),
        semiring.maxplus_vec_mat,
        semiring.maxplus_mat_mat,
    )
    # Each delta_t is shifted to max 0, so the final offset is the best path's score.
    log_score = offset[-1]
    _check_evidence(problem, log_score)
    backpointers = (delta[:-1].unsqueeze(-1) + problem.log_trans).argmax(-2)
    last = delta[-1].argmax(-1)
    path = semiring.compose_maps(last, backpointers.flip(0)).flip(0)
    return path.movedim(0, -1), log_score


def _categorical(logits, shape):
    """Categorical draws of shape ``shape`` (Gumbel-max); ``logits`` broadcasts to it + (K,)."""
    u = torch.rand(shape + logits.shape[-1:], dtype=logits.dtype, device=logits.device)
    # u = 0 gives Gumbel noise -inf, never NaN, so impossible (-inf) entries are never drawn.
    return (logits - torch.log(-torch.log(u))).argmax(-1)


def hmm_sample_paths(
    init_logits: torch.Tensor,
    trans_logits: torch.Tensor,
    obs_log_probs: torch.Tensor,
    num_samples: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    Exact posterior draws of :math:`z_{1:T} \\mid x_{1:T}` by forward-filter
    backward-sample, shape ``(num_samples, ..., T)`` long.

    For every ``t`` and every possible next state ``k`` a state
    :math:`s_t(k) \\sim p(z_t \\mid z_{t+1} = k, x_{1:t}) \\propto \\alpha_t A_{t+1}[:, k]`
    is drawn in parallel; composing these maps from :math:`z_T \\sim p(z_T \\mid x_{1:T})`
    by pointer jumping yields the backward sample.
    """
    num_samples = check_int(num_samples, "num_samples", low=1)
    problem = _Problem(init_logits, trans_logits, obs_log_probs, mask)
    filtered = _checked_filter(problem)
    log_filtered = torch.log(filtered)
    # (T-1, *batch, K_next, K_prev): conditional over z_t given z_{t+1} = row.
    logits = (log_filtered[:-1].unsqueeze(-1) + problem.log_trans).transpose(-1, -2)
    batch = problem.batch_shape
    map_shape = (problem.duration - 1, num_samples) + batch + logits.shape[-2:-1]
    maps = _categorical(logits.unsqueeze(1), map_shape)
    last = _categorical(log_filtered[-1], (num_samples,) + batch)
    paths = semiring.compose_maps(last, maps.flip(0)).flip(0)
    return paths.movedim(0, -1)


def _lin_vec_mat(v, m):
    return (torch.matmul(v[0].unsqueeze(-2), m[0]).squeeze(-2),)


def _lin_mat_mat(a, b):
    return (torch.matmul(a[0], b[0]),)


def hmm_predict(
    init_logits: torch.Tensor,
    trans_logits: torch.Tensor,
    obs_log_probs: torch.Tensor,
    num_steps: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    Predictive state probabilities :math:`p(z_{T+h} \\mid x_{1:T})`, ``h = 1..num_steps``,
    shape ``(..., num_steps, K)``; requires time-homogeneous ``trans_logits``.
    """
    num_steps = check_int(num_steps, "num_steps", low=1)
    problem = _Problem(init_logits, trans_logits, obs_log_probs, mask)
    if problem.time_varying:
        raise ValueError("hmm_predict needs time-homogeneous trans_logits (..., K, K)")
    last, log_norm = scan.vector_reduce(
        semiring.scaled_vector(problem.log_first()),
        semiring.scaled_matrix(problem.log_factors()),
        semiring.scaled_vec_mat,
        semiring.scaled_mat_mat,
    )
    _check_evidence(problem, log_norm)
    trans = torch.exp(problem.log_trans)
    steps = trans.expand((num_steps,) + trans.shape)
    pred = scan.vector_scan((last,), (steps,), _lin_vec_mat, _lin_mat_mat)[0][1:]
    return pred.movedim(0, -2)


# ---------------------------------------------------------------- distribution


class HiddenMarkovDistribution(TorchDistribution):
    """
    Discrete HMM with arbitrary emissions, marginalising the latent chain exactly.

    Like :class:`pyro.distributions.DiscreteHMM`, but ``init_logits`` is the distribution
    of the first state (see the module docstring) and inference uses the scans of this
    module. Time-varying parameters are recognised by rank relative to ``init_logits``:
    ``trans_logits`` of shape ``(..., T-1, K, K)`` has ``init_logits.dim() + 2`` dims and
    an ``observation_dist`` with batch shape ``(..., T, K)`` has ``init_logits.dim() + 1``
    batch dims (write batch dims of ``init_logits`` out, with size 1 if need be).

    ``value`` has shape ``(..., T, *event_shape)``; NaN entries mark missing observations
    (a row with any NaN is missing) and are marginalised.

    :param torch.Tensor init_logits: ``(..., K)``.
    :param torch.Tensor trans_logits: ``(..., K, K)`` or ``(..., T-1, K, K)``.
    :param observation_dist: batch shape ``(..., K)`` or ``(..., T, K)``.
    :param int duration: length ``T``, needed only to :meth:`sample` a fully homogeneous
        model.
    """

    arg_constraints = {"init_logits": constraints.real, "trans_logits": constraints.real}
    has_rsample = False

    def __init__(
        self, init_logits, trans_logits, observation_dist, validate_args=None, duration=None
    ):
        _check_tensor("init_logits", init_logits, 1, "(..., K)")
        _check_tensor("trans_logits", trans_logits, 2, "(..., K, K) or (..., T-1, K, K)")
        rank = init_logits.dim() - 1
        if trans_logits.dim() > rank + 3:
            raise ValueError(
                f"trans_logits may have at most init_logits.dim() + 2 = {rank + 3} dims, "
                f"got {tuple(trans_logits.shape)}"
            )
        obs_batch = observation_dist.batch_shape
        if len(obs_batch) < 1 or len(obs_batch) > rank + 2:
            raise ValueError(
                f"observation_dist must have batch shape (..., K) or (..., T, K) with at most "
                f"{rank + 2} dims, got {tuple(obs_batch)}"
            )
        self._trans_time_varying = trans_logits.dim() == rank + 3
        self._obs_time_varying = len(obs_batch) == rank + 2
        lengths = set()
        if self._trans_time_varying:
            lengths.add(trans_logits.shape[-3] + 1)
            trans_batch = trans_logits.shape[:-3]
        else:
            trans_batch = trans_logits.shape[:-2]
        if self._obs_time_varying:
            lengths.add(obs_batch[-2])
            obs_batch = obs_batch[:-2]
        else:
            obs_batch = obs_batch[:-1]
        if duration is not None:
            lengths.add(check_int(duration, "duration", low=1))
        if len(lengths) > 1:
            raise ValueError(
                f"time lengths of trans_logits, observation_dist and duration differ: {lengths}"
            )
        if observation_dist.batch_shape[-1] != init_logits.shape[-1]:
            raise ValueError(
                f"observation_dist batch shape must end in K = {init_logits.shape[-1]}, "
                f"got {tuple(observation_dist.batch_shape)}"
            )
        try:
            batch_shape = broadcast_shapes(init_logits.shape[:-1], trans_batch, obs_batch)
        except RuntimeError as e:
            raise ValueError(f"batch shapes of the arguments do not broadcast: {e}") from None
        self.init_logits = init_logits
        self.trans_logits = trans_logits
        self.observation_dist = observation_dist
        self._duration = lengths.pop() if lengths else None
        event_shape = (self._duration or 1,) + tuple(observation_dist.event_shape)
        super().__init__(batch_shape, torch.Size(event_shape), validate_args=validate_args)
        if self._validate_args:
            _check_some_state_possible("init_logits", init_logits)
            _check_some_state_possible("trans_logits", trans_logits)

    @property
    def duration(self):
        """Length ``T`` of the time axis, or ``None`` if not fixed by the parameters."""
        return self._duration

    @constraints.dependent_property(event_dim=2)
    def support(self):
        return constraints.independent(self.observation_dist.support, 1)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        num_states = self.init_logits.shape[-1]
        init = self.init_logits.expand(batch_shape + (num_states,))
        trans_tail = self.trans_logits.shape[-3 if self._trans_time_varying else -2 :]
        trans = self.trans_logits.expand(batch_shape + trans_tail)
        obs_tail = self.observation_dist.batch_shape[-2 if self._obs_time_varying else -1 :]
        obs = self.observation_dist.expand(batch_shape + obs_tail)
        return type(self)(init, trans, obs, validate_args=False, duration=self._duration)

    def _observation_terms(self, value):
        """Emission log-probs ``(..., T, K)``, the missing mask and the broadcast trans."""
        event_dim = len(self.observation_dist.event_shape)
        if value.dim() < 1 + event_dim:
            raise ValueError(
                f"value must have shape (..., T, *event_shape), got {tuple(value.shape)}"
            )
        missing, filled = None, value
        if value.is_floating_point():
            nan = torch.isnan(value)
            # Without missing values, no mask at all: the common case, and the cheaper one.
            # Reading the data on the host follows the validation switch, off in samplers
            # (torch.func.vmap, traced steps), which keep the general path.
            if not values_checked() or bool(nan.any()):
                # Missing rows get a point of the support so emission log-probs stay finite
                # (and gradients NaN-free) before they are masked out.
                with torch.no_grad():
                    try:
                        support = transform_to(self.observation_dist.support)
                        fill = support(torch.zeros_like(value))
                    except NotImplementedError:
                        # A discrete support has no transform: 0 lies in the usual ones
                        # (counts, categories, {0, 1}); the masked rows' densities are dropped.
                        fill = torch.zeros_like(value)
                filled = torch.where(nan, fill, value)
                missing = nan.flatten(-event_dim).any(-1) if event_dim else nan
        if self._validate_args:
            self._validate_sample(filled)
        if self._obs_time_varying:
            obs_lp = self.observation_dist.log_prob(filled.unsqueeze(-1 - event_dim))
        else:
            # Time goes first so that a (..., K) batch aligns with value's batch dims, which
            # are padded to the emission batch rank (parameters may be batched, the data not).
            filled = filled.movedim(-1 - event_dim, 0)
            pad = len(self.observation_dist.batch_shape) - 1 - (filled.dim() - 1 - event_dim)
            filled = filled.reshape(filled.shape[:1] + (1,) * max(pad, 0) + filled.shape[1:])
            filled = filled.unsqueeze(-1 - event_dim)
            obs_lp = self.observation_dist.log_prob(filled).movedim(0, -2)
        duration = obs_lp.shape[-2]
        # Pad obs_lp to the full batch rank so the floor reads trans_logits' rank correctly.
        batch = obs_lp.shape[:-2]
        if batch != self.batch_shape:
            batch = broadcast_shapes(batch, self.batch_shape)
            obs_lp = obs_lp.expand(batch + obs_lp.shape[-2:])
        mask = None if missing is None else ~missing.expand(batch + (duration,))
        trans = self.trans_logits
        if self._trans_time_varying:
            trans = trans.reshape((1,) * (obs_lp.dim() + 1 - trans.dim()) + trans.shape)
        return self.init_logits, trans, obs_lp, mask

    def _validate_sample(self, value):
        duration = value.size(-self.event_dim) if value.dim() >= self.event_dim else None
        if self._duration is None and duration is not None:
            # Homogeneous models accept any length; check against that length.
            old = self._event_shape
            self._event_shape = torch.Size((duration,) + old[1:])
            try:
                super()._validate_sample(value)
            finally:
                self._event_shape = old
        else:
            super()._validate_sample(value)

    def log_prob(self, value):
        return hmm_log_likelihood(*self._observation_terms(value))

    def filter(self, value):
        """Filtered state probabilities ``(..., T, K)``; see :func:`hmm_filter`."""
        return hmm_filter(*self._observation_terms(value))

    def smooth(self, value):
        """Posterior state marginals ``(..., T, K)``; see :func:`hmm_smooth`."""
        return hmm_smooth(*self._observation_terms(value))

    def viterbi(self, value):
        """``(path, log_score)``; see :func:`hmm_viterbi`."""
        return hmm_viterbi(*self._observation_terms(value))

    def sample_paths(self, value, num_samples):
        """Posterior path draws ``(num_samples, ..., T)``; see :func:`hmm_sample_paths`."""
        init, trans, obs_lp, mask = self._observation_terms(value)
        return hmm_sample_paths(init, trans, obs_lp, num_samples, mask=mask)

    def predict(self, value, num_steps):
        """Predictive state probabilities ``(..., num_steps, K)``; see :func:`hmm_predict`."""
        init, trans, obs_lp, mask = self._observation_terms(value)
        return hmm_predict(init, trans, obs_lp, num_steps, mask=mask)

    def sample(self, sample_shape=torch.Size()):
        """
        Draw ``(z, x)`` forward and return ``x`` of shape ``sample_shape + batch_shape +
        event_shape``. States are drawn in parallel as per-step maps ``z_t -> z_{t+1}``
        composed by pointer jumping.
        """
        if self._duration is None:
            raise ValueError(
                "sample() of a homogeneous HiddenMarkovDistribution needs the series' length: "
                "pass duration=T (the number of steps to draw) to HiddenMarkovDistribution(...), "
                "as for pyro.distributions.DiscreteHMM; HiddenMarkovModel passes its data's"
            )
        sample_shape = torch.Size(sample_shape)
        shape = sample_shape + self.batch_shape
        num_states = self.init_logits.shape[-1]
        with torch.no_grad():
            log_init = torch.log_softmax(self.init_logits, -1)
            log_init = log_init.expand(self.batch_shape + (num_states,))
            log_trans = torch.log_softmax(self.trans_logits, -1)
            if self._trans_time_varying:
                log_trans = log_trans.expand(self.batch_shape + log_trans.shape[-3:]).movedim(-3, 0)
            else:
                steps_shape = (self._duration - 1,) + self.batch_shape + (num_states,) * 2
                log_trans = log_trans.expand(steps_shape)
            first = _categorical(log_init, shape)
            # Insert sample dims after time so the per-step maps broadcast over samples.
            padded = log_trans.shape[:1] + (1,) * len(sample_shape) + log_trans.shape[1:]
            log_trans = log_trans.reshape(padded)
            steps = _categorical(log_trans, (self._duration - 1,) + shape + (num_states,))
            states = semiring.compose_maps(first, steps).movedim(0, -1)  # (*shape, T)
            event_dim = len(self.observation_dist.event_shape)
            if self._obs_time_varying:
                obs_batch = self.batch_shape + (self._duration, num_states)
                draws = self.observation_dist.expand(obs_batch).sample(sample_shape)
            else:
                obs_dist = self.observation_dist.expand(self.batch_shape + (num_states,))
                draws = obs_dist.sample((self._duration,) + sample_shape).movedim(0, -2 - event_dim)
            index = states.reshape(states.shape + (1,) * (event_dim + 1))
            index = index.expand(states.shape + (1,) + self.observation_dist.event_shape)
            return torch.gather(draws, -1 - event_dim, index).squeeze(-1 - event_dim)
