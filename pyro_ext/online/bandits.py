r"""
Decision making on top of an online Gaussian belief: Thompson sampling (and UCB, greedy
and :math:`\varepsilon`-greedy baselines) for multi-armed and contextual bandits, and a
1-D Bayesian-optimisation loop with an MLP surrogate, following Duran-Martin, Kara &
Murphy, "Efficient online Bayesian inference for neural bandits" (AISTATS 2022) and the
slides ``../shared/reference/murphy-bong-slides.md`` (sections "Thompson Sampling",
"Contextual Bandits", "Bayesian updating for contextual bandits" and "BayesOpt using
Thompson Sampling").

**Reward models.** A reward model is a Pyro model ``model(context, action, reward=None)``
over a batch of ``B`` rounds: ``action`` a long tensor ``(B,)``, ``context`` a tensor
``(B, ...)`` or ``None`` (a bandit without context), ``reward`` ``(B,)`` or ``None``. Its
one observed site is the reward, one element per round, and its mean is the expected
reward :math:`E[R_\theta(s, a)]`. The agent keeps *one* filter over the model's latent
sites: per-arm parameters indexed by ``action`` (the slides' factored prior: an update
only moves the pulled arm's block) or a network shared by the arms. The helpers
:func:`bernoulli_arms_model`, :func:`gaussian_arms_model`,
:func:`linear_contextual_model`, :func:`logistic_contextual_model` and
:func:`neural_contextual_model` build the usual ones; they put their parameters on the
device of ``action``, so an agent runs where its data lives.

**Environments** (:class:`BernoulliBandit`, :class:`GaussianBandit`,
:class:`LinearContextualBandit`, :class:`LogisticContextualBandit`) draw a context with
``context()``, a reward with ``reward(context, action)`` and tell the expected reward of
every arm, ``expected_rewards(context)``, from which :meth:`ThompsonBandit.run` computes
the (pseudo-)regret :math:`\max_a E[r \mid s, a] - E[r \mid s, a_t]`.

Example::

    env = BernoulliBandit(torch.tensor([0.1, 0.5, 0.6]))
    model = bernoulli_arms_model(3)
    agent = ThompsonBandit(lambda: BONG(model, family="diag"), num_arms=3)
    history = agent.run(env, num_steps=1000, seed=0)
    history.regrets.cumsum(0)
"""

import abc
import functools
import math
import numbers
import reprlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_mean, init_to_sample

from ..infer.tracing import ModelNotTraceableError, compile_graph, contiguous, trace_pure
from ..ops.random import device_random_state, set_device_random_state
from ..ops.validation import check_int, check_real, first_nonfinite
from . import updates
from .filters import BONG, LoFi

__all__ = [
    "BanditHistory",
    "BayesOptResult",
    "BernoulliBandit",
    "GaussianBandit",
    "LinearContextualBandit",
    "LogisticContextualBandit",
    "ThompsonBandit",
    "bayes_opt_1d",
    "bernoulli_arms_model",
    "gaussian_arms_model",
    "linear_contextual_model",
    "logistic_contextual_model",
    "neural_contextual_model",
]

POLICIES = ("thompson", "ucb", "greedy", "epsilon_greedy")


# -- argument checks --------------------------------------------------------------------------
def _check_int(name, value, low):
    return check_int(value, name, low=low)


def _check_positive(name, value, allow_zero=False):
    return check_real(value, name, low=0, low_open=not allow_zero)


def _check_hidden(hidden):
    if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
        hidden = (hidden,)
    if not isinstance(hidden, Sequence) or isinstance(hidden, str):
        raise TypeError(f"hidden must be an int or a sequence of ints, got {type(hidden).__name__}")
    if len(hidden) == 0:
        raise ValueError(
            "hidden must name at least one hidden layer's width (an int, or a non-empty "
            "sequence of ints >= 1), got an empty sequence; a network without hidden layers "
            "is linear_contextual_model's regression"
        )
    for width in hidden:
        _check_int("each hidden width", width, 1)
    return tuple(int(width) for width in hidden)


def _check_tensor(name, value, dim=None):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimension(s), got shape {tuple(value.shape)}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    _check_finite_tensor(name, value)
    return value


def _check_finite_tensor(name, value):
    """Refuse NaN or infinite entries of a floating-point ``value``, naming the first."""
    index = first_nonfinite(value)
    if index is not None:
        where = f" first at index {index}" if index else ""
        raise ValueError(f"{name} must be finite, got {value[index].item()!r}{where}")
    return value


# -- reward models ------------------------------------------------------------------------------
def _rounds(name, context, action, reward, context_dim):
    """The model's batch: ``action`` ``(B,)`` long, ``context`` ``(B, context_dim)`` or None."""
    if not isinstance(action, torch.Tensor) or action.dtype != torch.long or action.dim() != 1:
        raise TypeError(f"{name}: action must be a long tensor (B,) of arm indices")
    if context_dim is None:
        if context is not None:
            raise ValueError(f"{name} is a bandit without context: pass context=None")
    else:
        if not isinstance(context, torch.Tensor):
            raise TypeError(f"{name} needs a context tensor (B, {context_dim})")
        if tuple(context.shape) != (action.shape[0], context_dim):
            raise ValueError(
                f"{name}: context must have shape (B, {context_dim}) = "
                f"({action.shape[0]}, {context_dim}), got {tuple(context.shape)}"
            )
    if reward is not None and tuple(reward.shape) != tuple(action.shape):
        raise ValueError(
            f"{name}: reward must have the shape of action {tuple(action.shape)}, got "
            f"{tuple(reward.shape)}"
        )
    if context is not None and context.is_floating_point():
        dtype = context.dtype
    elif reward is not None and reward.is_floating_point():
        dtype = reward.dtype
    else:
        dtype = torch.get_default_dtype()
    return {"device": action.device, "dtype": dtype}


def _start_at_prior_mean(*args, **kwargs):
    # Linear-in-parameters reward models learn from the prior mean (their Jacobian does
    # not vanish there), which is the right start for every arm never pulled.
    return init_to_mean


def _start_at_a_prior_draw(*args, **kwargs):
    # A network's Jacobian vanishes at its prior mean of zeros: start at a prior draw.
    return init_to_sample


def bernoulli_arms_model(num_arms: int, prior_scale: float = 1.0) -> Callable:
    r"""
    A Bernoulli bandit's reward model: one logit per arm, :math:`\theta_k \sim \mathcal
    N(0, s^2)` (site ``"logits"`` ``(num_arms,)``), :math:`r \mid a \sim
    \mathrm{Bernoulli}(\sigma(\theta_a))` (site ``"reward"``). With a diagonal
    :class:`~pyro_ext.online.BONG` belief this is the slides' factored prior with one
    extended-Kalman update per pull (Duran-Martin, Kara & Murphy 2022). The filter
    starts at the prior mean.

    :param int num_arms: at least 2.
    :param float prior_scale: prior standard deviation ``s`` of each logit.
    """
    num_arms = _check_int("num_arms", num_arms, 2)
    prior_scale = _check_positive("prior_scale", prior_scale)

    def model(context, action, reward=None):
        opts = _rounds("bernoulli_arms_model", context, action, reward, None)
        logits = pyro.sample(
            "logits", dist.Normal(torch.zeros(num_arms, **opts), prior_scale).to_event(1)
        )
        with pyro.plate("rounds", action.shape[0]):
            return pyro.sample("reward", dist.Bernoulli(logits=logits[action]), obs=reward)

    model.num_arms, model.context_dim = num_arms, None
    model.default_init_strategy = _start_at_prior_mean
    return model


def gaussian_arms_model(
    num_arms: int, noise_scale: float = 1.0, prior_scale: float = 1.0
) -> Callable:
    r"""
    A Gaussian bandit's reward model: one mean per arm, :math:`\theta_k \sim \mathcal N(0,
    s^2)` (site ``"means"`` ``(num_arms,)``), :math:`r \mid a \sim \mathcal N(\theta_a,
    \sigma^2)` (site ``"reward"``) with a known noise scale :math:`\sigma`. BONG on it is
    the exact conjugate (Kalman) update, arm by arm.

    :param int num_arms: at least 2.
    :param float noise_scale: the reward noise :math:`\sigma`.
    :param float prior_scale: prior standard deviation ``s`` of each arm's mean.
    """
    num_arms = _check_int("num_arms", num_arms, 2)
    noise_scale = _check_positive("noise_scale", noise_scale)
    prior_scale = _check_positive("prior_scale", prior_scale)

    def model(context, action, reward=None):
        opts = _rounds("gaussian_arms_model", context, action, reward, None)
        means = pyro.sample(
            "means", dist.Normal(torch.zeros(num_arms, **opts), prior_scale).to_event(1)
        )
        with pyro.plate("rounds", action.shape[0]):
            return pyro.sample("reward", dist.Normal(means[action], noise_scale), obs=reward)

    model.num_arms, model.context_dim = num_arms, None
    model.default_init_strategy = _start_at_prior_mean
    return model


def _arm_weights(context_dim, num_arms, prior_scale, opts):
    prior = dist.Normal(torch.zeros(num_arms, context_dim, **opts), prior_scale).to_event(2)
    return pyro.sample("weights", prior)


def linear_contextual_model(
    context_dim: int, num_arms: int, noise_scale: float = 1.0, prior_scale: float = 1.0
) -> Callable:
    r"""
    The slides' linear contextual bandit: :math:`r \mid s, a \sim \mathcal N(w_a^\top s,
    \sigma^2)` with :math:`w_k \sim \mathcal N(0, s_0^2 I)` (site ``"weights"`` ``(num_arms,
    context_dim)``). No intercept: append a constant feature to the context for one.
    With a full BONG belief this is exact Bayesian linear regression per arm (the
    covariance stays block diagonal, the factored prior).

    :param int context_dim: the context's length.
    :param int num_arms: at least 2.
    :param float noise_scale: the reward noise :math:`\sigma`.
    :param float prior_scale: prior standard deviation :math:`s_0` of each weight.
    """
    context_dim = _check_int("context_dim", context_dim, 1)
    num_arms = _check_int("num_arms", num_arms, 2)
    noise_scale = _check_positive("noise_scale", noise_scale)
    prior_scale = _check_positive("prior_scale", prior_scale)

    def model(context, action, reward=None):
        opts = _rounds("linear_contextual_model", context, action, reward, context_dim)
        weights = _arm_weights(context_dim, num_arms, prior_scale, opts)
        mean = (weights[action] * context).sum(-1)
        with pyro.plate("rounds", action.shape[0]):
            return pyro.sample("reward", dist.Normal(mean, noise_scale), obs=reward)

    model.num_arms, model.context_dim = num_arms, context_dim
    model.default_init_strategy = _start_at_prior_mean
    return model


def logistic_contextual_model(
    context_dim: int, num_arms: int, prior_scale: float = 1.0
) -> Callable:
    r"""
    The slides' logistic contextual bandit: :math:`r \mid s, a \sim
    \mathrm{Bernoulli}(\sigma(w_a^\top s))` with :math:`w_k \sim \mathcal N(0, s_0^2 I)`
    (site ``"weights"`` ``(num_arms, context_dim)``). No intercept: append a constant
    feature to the context for one.

    :param int context_dim: the context's length.
    :param int num_arms: at least 2.
    :param float prior_scale: prior standard deviation :math:`s_0` of each weight.
    """
    context_dim = _check_int("context_dim", context_dim, 1)
    num_arms = _check_int("num_arms", num_arms, 2)
    prior_scale = _check_positive("prior_scale", prior_scale)

    def model(context, action, reward=None):
        opts = _rounds("logistic_contextual_model", context, action, reward, context_dim)
        weights = _arm_weights(context_dim, num_arms, prior_scale, opts)
        logits = (weights[action] * context).sum(-1)
        with pyro.plate("rounds", action.shape[0]):
            return pyro.sample("reward", dist.Bernoulli(logits=logits), obs=reward)

    model.num_arms, model.context_dim = num_arms, context_dim
    model.default_init_strategy = _start_at_prior_mean
    return model


def _layer_scales(sizes, scale):
    """Prior standard deviations ``(weight, bias)`` of each layer: ``scale / sqrt(fan_in)``
    and ``scale``."""
    return [(scale / math.sqrt(fan_in), scale) for fan_in in sizes[:-1]]


def _mlp(x, sizes, scales, activation, opts):
    """A Bayesian MLP ``x`` ``(B, sizes[0])`` -> ``(B, sizes[-1])``; sites ``layer{i}.*``."""
    for i, ((fan_in, fan_out), (weight_scale, bias_scale)) in enumerate(
        zip(zip(sizes[:-1], sizes[1:]), scales)
    ):
        weight = pyro.sample(
            f"layer{i}.weight",
            dist.Normal(torch.zeros(fan_out, fan_in, **opts), weight_scale).to_event(2),
        )
        bias = pyro.sample(
            f"layer{i}.bias", dist.Normal(torch.zeros(fan_out, **opts), bias_scale).to_event(1)
        )
        x = x @ weight.transpose(-1, -2) + bias
        if i < len(sizes) - 2:
            x = activation(x)
    return x


def neural_contextual_model(
    context_dim: int,
    num_arms: int,
    hidden: int | Sequence[int] = (32,),
    noise_scale: float = 1.0,
    prior_scale: float = 1.0,
) -> Callable:
    r"""
    The slides' neural bandit (Duran-Martin, Kara & Murphy 2022): :math:`r \mid s, a \sim
    \mathcal N(h_\theta(s)_a, \sigma^2)`, where :math:`h_\theta` is a tanh MLP from the
    context to one output per arm (features shared by the arms). Sites
    ``"layer{i}.weight"`` ``(out, in)`` and ``"layer{i}.bias"`` ``(out,)``, with priors
    :math:`\mathcal N(0, s_0^2 / \mathrm{fan_{in}})` and :math:`\mathcal N(0, s_0^2)`. The
    model declares a draw from the prior as the filter's start
    (``model.default_init_strategy``, :func:`~pyro.infer.autoguide.init_to_sample`): at
    the prior mean of zeros the network's Jacobian is zero and a linearised filter would
    never learn; an explicit ``init_strategy`` overrides it. Pair it with a low-rank
    belief, :func:`~pyro_ext.online.LoFi`, as the paper does.

    :param int context_dim: the context's length.
    :param int num_arms: at least 2.
    :param hidden: hidden widths (an int for one layer).
    :param float noise_scale: the reward noise :math:`\sigma`.
    :param float prior_scale: the prior scale :math:`s_0`.
    """
    context_dim = _check_int("context_dim", context_dim, 1)
    num_arms = _check_int("num_arms", num_arms, 2)
    sizes = (context_dim,) + _check_hidden(hidden) + (num_arms,)
    noise_scale = _check_positive("noise_scale", noise_scale)
    scales = _layer_scales(sizes, _check_positive("prior_scale", prior_scale))

    def model(context, action, reward=None):
        opts = _rounds("neural_contextual_model", context, action, reward, context_dim)
        outputs = _mlp(context.to(opts["dtype"]), sizes, scales, torch.tanh, opts)
        mean = outputs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        with pyro.plate("rounds", action.shape[0]):
            return pyro.sample("reward", dist.Normal(mean, noise_scale), obs=reward)

    model.num_arms, model.context_dim = num_arms, context_dim
    model.default_init_strategy = _start_at_a_prior_draw
    return model


# -- environments ---------------------------------------------------------------------------
class _Bandit(abc.ABC):
    """An environment: ``num_arms``, ``context()``, ``reward(context, action)``,
    ``expected_rewards(context)`` ``(num_arms,)``, ``best_mean(context)``."""

    num_arms: int

    def context(self) -> torch.Tensor | None:
        """The next round's context (``None`` for a bandit without context)."""
        return None

    @abc.abstractmethod
    def expected_rewards(self, context) -> torch.Tensor:
        """The expected reward of every arm in ``context``, ``(num_arms,)``."""

    @abc.abstractmethod
    def reward(self, context, action) -> torch.Tensor:
        """One draw of the reward of arm ``action`` in ``context``."""

    def best_mean(self, context=None) -> torch.Tensor:
        """The expected reward of the best arm in this context."""
        return self.expected_rewards(context).max()

    def _arm(self, action):
        if isinstance(action, torch.Tensor):
            if action.dim() != 0 or action.is_floating_point() or action.dtype == torch.bool:
                raise TypeError("action must be an int (or a 0-dim integer tensor)")
            action = int(action)
        if isinstance(action, bool) or not isinstance(action, numbers.Integral):
            raise TypeError(f"action must be an int, got {type(action).__name__}")
        if not 0 <= action < self.num_arms:
            raise ValueError(f"action must lie in [0, {self.num_arms}), got {action}")
        return int(action)


class BernoulliBandit(_Bandit):
    """
    A Bernoulli bandit: arm ``k`` pays 1 with probability ``probs[k]``, else 0.

    :param torch.Tensor probs: ``(num_arms,)`` success probabilities in ``[0, 1]`` (their
        device is the environment's).
    """

    def __init__(self, probs: torch.Tensor):
        probs = _check_tensor("probs", probs, dim=1)
        if probs.shape[0] < 2:
            raise ValueError(f"a bandit needs at least 2 arms, got {probs.shape[0]}")
        if not bool(((probs >= 0) & (probs <= 1)).all()):
            raise ValueError("probs must lie in [0, 1]")
        self.probs = probs
        self.num_arms = probs.shape[0]

    def expected_rewards(self, context=None):
        return self.probs

    def reward(self, context, action):
        return torch.bernoulli(self.probs[self._arm(action)])


class GaussianBandit(_Bandit):
    """
    A Gaussian bandit: arm ``k`` pays :math:`\\mathcal N(\\mathrm{means}_k, \\mathrm{scale}^2)`.

    :param torch.Tensor means: ``(num_arms,)`` expected rewards.
    :param float scale: the reward noise's standard deviation.
    """

    def __init__(self, means: torch.Tensor, scale: float = 1.0):
        means = _check_tensor("means", means, dim=1)
        if means.shape[0] < 2:
            raise ValueError(f"a bandit needs at least 2 arms, got {means.shape[0]}")
        self.means = means
        self.scale = _check_positive("scale", scale)
        self.num_arms = means.shape[0]

    def expected_rewards(self, context=None):
        return self.means

    def reward(self, context, action):
        mean = self.means[self._arm(action)]
        return mean + self.scale * torch.randn((), dtype=mean.dtype, device=mean.device)


class _ContextualBandit(_Bandit):
    def __init__(self, weights):
        weights = _check_tensor("weights", weights, dim=2)
        if weights.shape[0] < 2:
            raise ValueError(f"a bandit needs at least 2 arms, got {weights.shape[0]}")
        self.weights = weights
        self.num_arms, self.context_dim = weights.shape

    def context(self):
        w = self.weights
        return torch.randn(self.context_dim, dtype=w.dtype, device=w.device)

    def _scores(self, context):
        context = _check_tensor("context", context, dim=1)
        if context.shape[0] != self.context_dim:
            raise ValueError(f"context must have length {self.context_dim}, got {context.shape[0]}")
        return self.weights @ context


class LinearContextualBandit(_ContextualBandit):
    r"""
    A linear contextual bandit: contexts :math:`s \sim \mathcal N(0, I)`, rewards
    :math:`r \mid s, a \sim \mathcal N(w_a^\top s, \sigma^2)` with hidden weights ``W``.

    :param torch.Tensor weights: ``(num_arms, context_dim)`` hidden weights (e.g.
        ``torch.randn(num_arms, context_dim)``).
    :param float noise_scale: :math:`\sigma`.
    """

    def __init__(self, weights: torch.Tensor, noise_scale: float = 1.0):
        super().__init__(weights)
        self.noise_scale = _check_positive("noise_scale", noise_scale)

    def expected_rewards(self, context):
        return self._scores(context)

    def reward(self, context, action):
        mean = self._scores(context)[self._arm(action)]
        return mean + self.noise_scale * torch.randn((), dtype=mean.dtype, device=mean.device)


class LogisticContextualBandit(_ContextualBandit):
    r"""
    A logistic contextual bandit: contexts :math:`s \sim \mathcal N(0, I)`, rewards
    :math:`r \mid s, a \sim \mathrm{Bernoulli}(\sigma(w_a^\top s))` with hidden weights.

    :param torch.Tensor weights: ``(num_arms, context_dim)`` hidden weights.
    """

    def expected_rewards(self, context):
        return self._scores(context).sigmoid()

    def reward(self, context, action):
        return torch.bernoulli(self._scores(context)[self._arm(action)].sigmoid())


# -- the agent ---------------------------------------------------------------------------------
class BanditHistory(NamedTuple):
    """What :meth:`ThompsonBandit.run` returns, one entry per step."""

    #: ``(T,)`` the rewards received
    rewards: torch.Tensor
    #: ``(T,)`` expected regret of each action, :math:`\max_a E[r \mid s_t, a] - E[r \mid s_t, a_t]`
    regrets: torch.Tensor
    #: ``(T,)`` long, the arms pulled
    actions: torch.Tensor


class ThompsonBandit:
    r"""
    A bandit agent on one online Gaussian belief over a reward model's latent sites
    (Duran-Martin, Kara & Murphy 2022; the slides' sections "Thompson Sampling", "Upper
    Confidence Bound" and "Contextual Bandits").

    Each round, :meth:`act` scores every arm by its expected reward
    :math:`E[R_\theta(s, a)]`, the mean of the model's reward site, computed for all arms
    in one batched run of the model with the latent sites conditioned on a value of
    :math:`\theta`; the arm with the highest score is pulled:

    * ``"thompson"``: :math:`\theta` is one joint draw from the belief, so an arm is
      pulled with the posterior probability that it is the best;
    * ``"ucb"``: :math:`\theta` is the belief's mean, plus ``ucb_scale`` times the
      posterior standard deviation of the expected reward, linearised,
      :math:`\sqrt{\mathrm{diag}(H \Sigma H^\top)}` (the epistemic spread only: the reward
      noise does not shrink with data and would favour noisy arms);
    * ``"greedy"``: the belief's mean;
    * ``"epsilon_greedy"``: greedy, but a uniformly random arm with probability
      ``epsilon`` (``epsilon=1`` is the uniform random baseline).

    Ties are broken uniformly at random. :meth:`observe` updates the belief with the
    round's reward. Before the first observation there is no belief (a filter builds it
    from the model's arguments at its first update): the first action is uniformly
    random, whatever the policy. Randomness comes from torch's global generator
    (``pyro.set_rng_seed``).

    :param callable filter_factory: a zero-argument callable returning a fresh filter
        (a :class:`~pyro_ext.online.BONG`) over a reward model ``model(context, action,
        reward=None)`` (see the module docstring), e.g. ``lambda: BONG(model,
        family="diag")``; :meth:`reset` calls it again (and a filter built with
        ``jit_compile=True`` traces its update again, from inductor's disk cache). With
        ``jit_compile=True`` each round's :meth:`observe` is one compiled update; the
        action is still computed eagerly.
    :param int num_arms: number of arms, at least 2; the number the reward model declares
        (``model.num_arms``, as this module's helpers do), if it does.
    :param str policy: ``"thompson"`` (default), ``"ucb"``, ``"greedy"`` or
        ``"epsilon_greedy"``.
    :param float ucb_scale: the UCB multiplier ``c >= 0`` (default 1).
    :param float epsilon: exploration probability of ``"epsilon_greedy"``, in ``[0, 1]``
        (default 0.1).
    """

    def __init__(
        self,
        filter_factory: Callable[[], BONG],
        num_arms: int,
        policy: str = "thompson",
        ucb_scale: float = 1.0,
        epsilon: float = 0.1,
    ):
        if not callable(filter_factory):
            raise TypeError(
                "filter_factory must be a zero-argument callable returning a filter (e.g. "
                f"lambda: BONG(model)), got {type(filter_factory).__name__}"
            )
        self.num_arms = _check_int("num_arms", num_arms, 2)
        if not isinstance(policy, str):
            raise TypeError(f"policy must be a string, got {type(policy).__name__}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.ucb_scale = _check_positive("ucb_scale", ucb_scale, allow_zero=True)
        if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
            raise TypeError(f"epsilon must be a number, got {type(epsilon).__name__}")
        if not 0 <= epsilon <= 1:
            raise ValueError(f"epsilon must lie in [0, 1], got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.filter_factory = filter_factory
        self.reset()

    def reset(self) -> "ThompsonBandit":
        """Start again from a fresh filter (the prior). Returns ``self``."""
        filter = self.filter_factory()
        if not isinstance(filter, BONG):
            raise TypeError(
                f"filter_factory must return a BONG filter (BONG, LoFi, WoLF), got "
                f"{type(filter).__name__}"
            )
        if filter.belief is not None:
            raise ValueError(
                f"filter_factory returned a filter that already holds a belief "
                f"({filter.num_updates} updates); it must build a new filter at each call "
                "(reset() starts again from the prior), e.g. lambda: BONG(model)"
            )
        # A reward model that declares its arms (the helpers of this module do) must have
        # as many as the agent: fewer fail at the first pull of a missing arm, more are
        # never considered.
        declared = getattr(filter.model, "num_arms", None)
        if declared is not None and declared != self.num_arms:
            raise ValueError(
                f"num_arms is {self.num_arms}, but the filter's reward model has {declared} "
                f"arms; pass num_arms={declared}, or build the model with {self.num_arms} arms"
            )
        #: the filter holding the belief (its ``belief`` is ``None`` before the first observation)
        self.filter = filter
        self._site = None
        #: the traced scoring of the arms (a filter built with ``jit_compile``), by the
        #: context's shape; ``False`` once a model proved untraceable
        self._score_graphs = {}
        return self

    def __repr__(self):
        extra = {
            "ucb": f", ucb_scale={self.ucb_scale}",
            "epsilon_greedy": f", epsilon={self.epsilon}",
        }
        return (
            f"ThompsonBandit(num_arms={self.num_arms}, policy={self.policy!r}"
            f"{extra.get(self.policy, '')}, num_updates={self.filter.num_updates})"
        )

    # -- scoring -------------------------------------------------------------------------
    def _device(self, *tensors):
        if self.filter.belief is not None:
            return self.filter.belief.mean.device
        for x in tensors:
            if isinstance(x, torch.Tensor):
                return x.device
        return torch.device("cpu")

    def _check_context(self, context, batch=None):
        """
        ``context``: ``None`` or a tensor, finite, of the shape the reward model declares
        (its ``context_dim``; the helpers of this module declare it): one round's
        ``(context_dim,)``, or ``(batch, context_dim)`` for a batch of ``batch`` rounds.
        Read once per call, on the round's new data.
        """
        if context is not None and not isinstance(context, torch.Tensor):
            raise TypeError(f"context must be None or a tensor, got {type(context).__name__}")
        model = self.filter.model
        if not hasattr(model, "context_dim"):
            if context is not None:
                _check_finite_tensor("context", context)
            return
        context_dim = model.context_dim
        if context_dim is None:
            if context is not None:
                raise ValueError(
                    "context must be None: the reward model is a bandit without context, got "
                    f"a tensor of shape {tuple(context.shape)}"
                )
            return
        if context is None:
            raise TypeError(
                f"context must be a tensor: the reward model needs a context tensor "
                f"({context_dim},), got None"
            )
        expected = (context_dim,) if batch is None else (batch, context_dim)
        if tuple(context.shape) != expected:
            raise ValueError(
                f"context must have shape {expected}"
                + (" (one round's)" if batch is None else " (one row per round of action)")
                + f", got {tuple(context.shape)}"
            )
        if context.is_complex() or context.dtype == torch.bool:
            raise TypeError(f"context must be a real tensor, got dtype {context.dtype}")
        _check_finite_tensor("context", context)

    def expected_rewards(self, context=None, theta: torch.Tensor | None = None) -> torch.Tensor:
        r"""
        The expected reward :math:`E[R_\theta(s, a)]` of every arm ``(num_arms,)`` at flat
        unconstrained parameters ``theta`` ``(D,)`` (default: the belief's mean), in
        context ``context`` (one round's, not batched; ``None`` without context).
        """
        self._check_context(context)
        if self.filter.belief is None:
            raise RuntimeError("no belief yet: observe() at least one round first")
        if theta is None:
            theta = self.filter.belief.mean
        else:
            dim = self.filter.belief.mean.shape[0]
            if not isinstance(theta, torch.Tensor) or not theta.is_floating_point():
                raise TypeError(
                    f"theta must be a floating-point tensor ({dim},), got "
                    f"{type(theta).__name__ if not isinstance(theta, torch.Tensor) else theta.dtype}"
                )
            if tuple(theta.shape) != (dim,):
                raise ValueError(
                    f"theta must have shape ({dim},) (the belief's flat unconstrained "
                    f"parameters), got {tuple(theta.shape)}"
                )
            _check_finite_tensor("theta", theta)
        return self._arm_means(self.filter.potential.constrain(theta), context)

    def _arm_means(self, values, context):
        num_arms, mean = self.num_arms, self.filter.belief.mean
        actions = torch.arange(num_arms, device=mean.device)
        if context is not None:
            context = context.to(mean.device).unsqueeze(0).expand((num_arms,) + context.shape)
        # An observed placeholder reward: the model draws nothing, we read its mean.
        placeholder = mean.new_zeros(num_arms)
        model = pyro.poutine.condition(self.filter.model, data=values)
        with pyro.poutine.block(), pyro.validation_enabled(False):
            trace = pyro.poutine.trace(model).get_trace(context, actions, placeholder)
        arm_means = trace.nodes[self._site]["fn"].mean
        if arm_means.numel() != num_arms:
            raise ValueError(
                f"the reward site {self._site!r} has {arm_means.numel()} means for "
                f"{num_arms} rounds; a reward model gives one reward per round"
            )
        return arm_means.reshape(num_arms)

    def _compiled_scores(self, context):
        """
        The arms' scores through one traced (compiled) graph of the belief, the draw's
        standard normal noise (drawn here, as :func:`~.updates.sample` draws it) and the
        context: the draw, the drift and the batched model run that the eager scoring does
        op by op. ``None`` when the scoring runs eagerly: a model that cannot be traced, or
        a round whose checks fail in the graph (a covariance without a Cholesky factor),
        which the eager scoring then reports, from the same random state.
        """
        filter = self.filter
        belief = filter.belief
        thompson = self.policy == "thompson"
        key = (tuple(context.shape), context.dtype) if context is not None else None
        graph = self._score_graphs.get(key)
        if graph is False:
            return None
        device = belief.mean.device
        inputs, random_state = contiguous(belief), None
        if thompson:
            random_state = device_random_state(device)
            mean = belief.mean
            inputs.append(torch.randn((1,) + mean.shape, dtype=mean.dtype, device=device))
        if context is not None:
            inputs.append(context.contiguous())
        if graph is None:
            num_belief, belief_type = len(belief), type(belief)

            def scores(*inputs):
                current = belief_type(*inputs[:num_belief])
                rest = list(inputs[num_belief:])
                # The draw's factorisations check themselves inside the graph.
                with updates.deferred_checks() as flags:
                    if thompson:
                        noise = rest.pop(0)
                        predicted = current
                        if filter.drift is not None:
                            predicted = updates.predict_random_walk(current, filter.drift)
                        theta = updates.sample(predicted, 1, noise=noise)[0]
                    else:
                        theta = current.mean
                    means = self._arm_means(filter.potential.constrain(theta), *rest or [None])
                # A chain of ands, which the graph fuses (a stacked vector of the flags
                # costs a buffer and a view per flag at every call).
                ok = (
                    functools.reduce(torch.logical_and, flags)
                    if flags
                    else means.new_ones((), dtype=torch.bool)
                )
                return means, ok

            try:
                traced = trace_pure(scores, inputs, "build the filter with jit_compile=False")
            except ModelNotTraceableError:
                self._score_graphs[key] = False  # the filter's own update warns about it
                return None
            cudagraphs = False
            if filter.jit_compile == "trace":
                fn = traced
            else:
                fn, _, cudagraphs = compile_graph(
                    traced, inputs, filter.compile_mode, "scoring", contiguous_inputs=True
                )
            graph = self._score_graphs[key] = (fn, cudagraphs)
        fn, cudagraphs = graph
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        means, ok = fn(*inputs)
        if not bool(ok):
            if random_state is not None:
                set_device_random_state(device, random_state)
            return None
        # A CUDA graph's outputs are overwritten by its next replay.
        return means.clone() if cudagraphs else means

    def _scores(self, context):
        if self.filter.jit_compile and self.policy in ("thompson", "greedy", "epsilon_greedy"):
            if context is not None:
                context = context.to(self.filter.belief.mean.device)
            scores = self._compiled_scores(context)
            if scores is not None:
                return scores
        if self.policy == "thompson":
            with torch.no_grad():
                # A draw of the parameters of the coming round: after the drift, if any.
                theta = updates.sample(self.filter.predicted_belief(), 1)[0]
                return self._arm_means(self.filter.potential.constrain(theta), context)
        if self.policy != "ucb":
            with torch.no_grad():
                return self.expected_rewards(context)
        # The bonus is the spread of the expected reward (noise=False): the reward noise
        # never shrinks and would favour the arms with the noisiest rewards.
        device = self.filter.belief.mean.device
        actions = torch.arange(self.num_arms, device=device)
        if context is not None:
            context = context.to(device).unsqueeze(0).expand((self.num_arms,) + context.shape)
        mean, variance = self.filter.predictive(context, actions, noise=False)
        bonus = self.ucb_scale * variance.clamp_min(0).sqrt()
        return (mean + bonus).reshape(self.num_arms)

    def _random_arm(self, device):
        return int(torch.randint(self.num_arms, (), device=device))

    def act(self, context: torch.Tensor | None = None) -> int:
        """The arm to pull in this round's ``context`` (``None`` without context)."""
        self._check_context(context)
        device = self._device(context)
        if self.filter.belief is None:
            return self._random_arm(device)
        if self.policy == "epsilon_greedy" and bool(torch.rand((), device=device) < self.epsilon):
            return self._random_arm(device)
        scores = self._scores(context)
        if self.policy == "thompson":
            return int(scores.argmax())
        best = (scores == scores.max()).nonzero().reshape(-1)
        if best.shape[0] == 1:
            return int(best[0])
        return int(best[torch.randint(best.shape[0], (), device=best.device)])

    # -- learning -------------------------------------------------------------------------
    def observe(self, context, action, reward) -> "ThompsonBandit":
        """
        Update the belief with one round, ``action`` an int (or a 0-dim integer tensor)
        and ``reward`` a number or 0-dim tensor, or with a batch of rounds: ``action``
        ``(B,)``, ``reward`` ``(B,)``, ``context`` ``(B, ...)``. Returns ``self``.
        """
        if isinstance(action, torch.Tensor) and action.dim() == 1:
            self._check_context(context, batch=action.shape[0])
        else:
            self._check_context(context)
        device = self._device(context, reward, action)
        if isinstance(action, torch.Tensor):
            if action.is_floating_point() or action.is_complex() or action.dtype == torch.bool:
                raise TypeError(f"action must hold integers, got dtype {action.dtype}")
            if action.dim() > 1:
                raise ValueError(
                    f"action must be an int or a tensor (B,), got {tuple(action.shape)}"
                )
            single = action.dim() == 0
            action = action.to(device=device, dtype=torch.long)
            if bool(((action < 0) | (action >= self.num_arms)).any()):
                raise ValueError(f"action must lie in [0, {self.num_arms}), got {action.tolist()}")
        elif isinstance(action, numbers.Integral) and not isinstance(action, bool):
            # Checked as a Python int: the tensor comparisons cost microseconds per round.
            if not 0 <= action < self.num_arms:
                raise ValueError(f"action must lie in [0, {self.num_arms}), got {int(action)}")
            single, action = True, torch.tensor(int(action), device=device)
        else:
            raise TypeError(
                f"action must be an int or an integer tensor, got {type(action).__name__}"
            )
        if isinstance(reward, bool) or not isinstance(reward, (numbers.Real, torch.Tensor)):
            raise TypeError(f"reward must be a number or a tensor, got {type(reward).__name__}")
        dtype = self.filter.belief.mean.dtype if self.filter.belief is not None else None
        reward = torch.as_tensor(reward, device=device)
        reward = reward.to(
            dtype or (reward.dtype if reward.is_floating_point() else torch.get_default_dtype())
        )
        if tuple(reward.shape) != tuple(action.shape):
            raise ValueError(
                f"reward must have the shape of action {tuple(action.shape)}, got "
                f"{tuple(reward.shape)}"
            )
        if action.numel() == 0:
            raise ValueError("action and reward are empty: observe at least one round")
        # A bandit's reward is never missing (a filter would skip a NaN one silently).
        _check_finite_tensor("reward", reward)
        if single:
            action, reward = action.unsqueeze(0), reward.unsqueeze(0)
            if context is not None:
                context = context.unsqueeze(0)
        if context is not None:
            context = context.to(device)
        self.filter.update(context, action, reward)
        if self._site is None:
            sites = self.filter.observed_sites
            if len(sites) != 1:
                self.reset()
                raise ValueError(
                    f"a reward model has one observed site, the reward; this one has {sites}"
                )
            self._site = sites[0]
        return self

    def run(self, env, num_steps: int, seed: int | None = None) -> BanditHistory:
        """
        Play ``num_steps`` rounds of ``env`` from a fresh filter (:meth:`reset`), after
        ``pyro.set_rng_seed(seed)`` when a seed is given. Returns a :class:`BanditHistory`
        of per-step rewards, expected regrets and actions.
        """
        for attribute in ("num_arms", "context", "reward", "expected_rewards"):
            if not hasattr(env, attribute):
                raise TypeError(
                    "env must be a bandit environment (num_arms, context(), reward(context, "
                    f"action), expected_rewards(context)); it has no {attribute!r}"
                )
        if env.num_arms != self.num_arms:
            raise ValueError(f"env has {env.num_arms} arms, the agent {self.num_arms}")
        num_steps = _check_int("num_steps", num_steps, 1)
        if seed is not None:
            pyro.set_rng_seed(_check_int("seed", seed, 0))
        self.reset()
        rewards, regrets, actions = [], [], []
        for _ in range(num_steps):
            context = env.context()
            action = self.act(context)
            reward = torch.as_tensor(env.reward(context, action))
            means = torch.as_tensor(env.expected_rewards(context))
            self.observe(context, action, reward)
            rewards.append(reward)
            regrets.append(means.max() - means[action])
            actions.append(action)
        rewards = torch.stack(rewards)
        return BanditHistory(
            rewards,
            torch.stack(regrets).to(rewards.device),
            torch.tensor(actions, device=rewards.device),
        )


# -- Bayesian optimisation -------------------------------------------------------------------
class BayesOptResult(NamedTuple):
    """What :func:`bayes_opt_1d` returns."""

    #: ``(T,)`` the points queried, in order
    xs: torch.Tensor
    #: ``(T,)`` the objective's values there
    ys: torch.Tensor
    #: the best point queried
    best_x: torch.Tensor
    #: the objective there
    best_y: torch.Tensor
    #: the agent (its ``filter`` holds the surrogate's belief, e.g. to plot its posterior)
    agent: ThompsonBandit


#: the belief's scale of the surrogate's hidden weights, relative to their random start
_FEATURE_BELIEF_SCALE = 0.01


def bayes_opt_1d(
    objective: Callable,
    bounds: tuple[float, float],
    num_steps: int = 40,
    filter_factory: Callable | None = None,
    hidden: int | Sequence[int] = 128,
    prior_scale: float = 16.0,
    input_scale: float = 6.0,
    noise_scale: float = 0.05,
    grid_size: int = 500,
    seed: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
) -> BayesOptResult:
    r"""
    Maximise a 1-D black-box ``objective`` on ``[low, high]`` by Thompson sampling with a
    Bayesian MLP surrogate updated online (the slides' "BayesOpt using Thompson Sampling"
    and its "MLP + TS + LRKF" figure): at each step draw :math:`\tilde\theta_t \sim
    p(\theta \mid D_{1:t})` from the filter's belief, query :math:`x_{t+1} = \arg\max_x
    f_{\tilde\theta_t}(x)` over a grid of ``grid_size`` points, observe :math:`y_{t+1}` and
    update the belief. It is the bandit with one arm per grid point (the slides: "equivalent
    to a MAB with one arm for each point"), so it runs a :class:`ThompsonBandit`; the first
    query is uniformly random.

    The surrogate is :math:`y \sim \mathcal N(f_\theta(u), \sigma^2)`, a tanh MLP of the
    input rescaled to :math:`u \in [-1, 1]`. Its hidden weights start at a random draw
    (first layer :math:`\mathcal N(0, \mathrm{input\_scale}^2)`, later ones
    :math:`\mathcal N(0, 1/\mathrm{fan_{in}})`, biases :math:`\mathcal N(0, 1)`) with a
    belief 100 times narrower, and its output layer starts at zero with prior
    :math:`\mathcal N(0, \mathrm{prior\_scale}^2/\mathrm{width})`: a Bayesian regression
    on random features that adapt slowly, close to a Gaussian process, as in Duran-Martin
    et al.'s low-rank filters for BayesOpt. A generous ``prior_scale`` (many times the
    objective's range) keeps the draws exploring away from the data; ``input_scale`` sets
    how wiggly the surrogate may be (larger: shorter length scales). The surrogate works in
    ``dtype`` (float64 by default: a narrow hidden belief and a broad output one make the
    precision too ill-conditioned for float32).

    :param callable objective: ``x`` (a 0-dim tensor) -> a number or 0-dim tensor.
    :param tuple bounds: ``(low, high)``, finite, ``low < high``.
    :param int num_steps: number of queries.
    :param callable filter_factory: ``model -> filter`` for the surrogate ``model(context,
        action, reward=None)`` (default ``lambda model: LoFi(model, rank=10)``).
    :param hidden: the MLP's hidden widths (an int for one layer).
    :param float prior_scale: the output layer's prior scale, in units of the objective.
    :param float input_scale: the first layer's weight scale on the rescaled input.
    :param float noise_scale: :math:`\sigma`, the surrogate's observation noise.
    :param int grid_size: points of the grid searched, at least 2.
    :param int seed: ``pyro.set_rng_seed(seed)`` first when given.
    :param device: where the surrogate lives (default CPU).
    :param torch.dtype dtype: the surrogate's floating-point type.
    """
    if not callable(objective):
        raise TypeError(f"objective must be callable, got {type(objective).__name__}")
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise TypeError(f"bounds must be a pair (low, high), got {bounds!r}")
    low, high = (_check_finite("bounds", b) for b in bounds)
    if not low < high:
        raise ValueError(f"bounds must have low < high, got {bounds!r}")
    num_steps = _check_int("num_steps", num_steps, 1)
    grid_size = _check_int("grid_size", grid_size, 2)
    sizes = (1,) + _check_hidden(hidden) + (1,)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if device is not None:
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"device must be None, a str or a torch.device, got {device!r}")
        try:
            device = torch.device(device)
        except RuntimeError as error:
            raise ValueError(f"device {device!r} is not a torch device ({error})") from None
    # The grid's points must be distinct, finite numbers of the surrogate's dtype.
    largest = torch.finfo(dtype).max
    if max(abs(low), abs(high)) > largest or not (high - low) <= largest:
        raise ValueError(
            f"bounds {bounds!r} span {high - low!r}, more than {dtype} can represent (its "
            f"largest number is {largest:.4g}); rescale the objective's input"
        )
    grid = torch.linspace(low, high, grid_size, device=device, dtype=dtype)
    if not bool((grid[1:] > grid[:-1]).all()):
        raise ValueError(
            f"bounds {bounds!r} are too close for {dtype} to hold grid_size={grid_size} "
            "distinct points between them; widen the bounds, lower grid_size or use "
            "dtype=torch.float64"
        )
    prior_scale = _check_positive("prior_scale", prior_scale)
    input_scale = _check_positive("input_scale", input_scale)
    noise_scale = _check_positive("noise_scale", noise_scale)
    if filter_factory is None:

        def filter_factory(model):
            return LoFi(model, rank=10)

    elif not callable(filter_factory):
        raise TypeError(
            "filter_factory must be a callable model -> filter, got "
            f"{type(filter_factory).__name__}"
        )
    if seed is not None:
        pyro.set_rng_seed(_check_int("seed", seed, 0))
    inputs = torch.linspace(-1.0, 1.0, grid_size, device=device, dtype=dtype)
    # The random start of each site (its belief's mean) and the belief's scale (the prior).
    starts = [(input_scale, 1.0)] + [(1 / math.sqrt(n), 1.0) for n in sizes[1:-2]] + [(0, 0)]
    scales = [(_FEATURE_BELIEF_SCALE * w, _FEATURE_BELIEF_SCALE * b) for w, b in starts[:-1]]
    scales.append((prior_scale / math.sqrt(sizes[-2]), prior_scale))
    start_of = {}
    for i, (weight, bias) in enumerate(starts):
        start_of[f"layer{i}.weight"], start_of[f"layer{i}.bias"] = weight, bias

    def surrogate(context, action, reward=None):
        opts = {"device": action.device, "dtype": dtype}
        u = inputs.to(action.device)[action].unsqueeze(-1)
        mean = _mlp(u, sizes, scales, torch.tanh, opts).squeeze(-1)
        with pyro.plate("rounds", action.shape[0]):
            return pyro.sample("y", dist.Normal(mean, noise_scale), obs=reward)

    def random_features(site):
        fn = site["fn"]
        return start_of[site["name"]] * torch.randn(fn.shape(), dtype=dtype, device=fn.mean.device)

    surrogate.num_arms, surrogate.context_dim = grid_size, None
    surrogate.default_init_strategy = lambda *args, **kwargs: random_features
    agent = ThompsonBandit(lambda: filter_factory(surrogate), grid_size)
    xs, ys = [], []
    for _ in range(num_steps):
        action = agent.act()
        x = grid[action]
        y = _objective_value(objective(x), x, dtype)
        agent.observe(None, action, y)
        xs.append(x)
        ys.append(y)
    xs, ys = torch.stack(xs), torch.stack(ys)
    best = int(ys.argmax())
    return BayesOptResult(xs, ys, xs[best], ys[best], agent)


def _check_finite(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be numbers, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _objective_value(value, x, dtype):
    """The objective's return ``value`` at ``x`` as a finite 0-dim tensor of ``dtype``."""
    where = f"at x = {x.item()!r}; expected a finite float (one real number)"
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"objective returned a tensor of shape {tuple(value.shape)} {where}")
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"objective returned a tensor of dtype {value.dtype} {where}")
        number = float(value.detach().reshape(()))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
    else:
        raise TypeError(
            f"objective returned {reprlib.repr(value)} ({type(value).__name__}) {where}"
        )
    y = torch.tensor(number, dtype=dtype, device=x.device)
    if not (math.isfinite(number) and bool(torch.isfinite(y))):
        raise ValueError(
            f"objective returned {number!r} {where}"
            + (f" in {dtype}" if math.isfinite(number) else "")
        )
    return y
