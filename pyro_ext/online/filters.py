r"""
Online variational Bayes for Pyro models: BONG and its relatives (BLR, BOG, BBB), with
full, diagonal and diagonal-plus-low-rank (LoFi) Gaussian beliefs and WoLF's outlier
weighting. The pure steps are in :mod:`pyro_ext.online.updates`; this module reads the
model (its latent sites, their Gaussian priors, its observed sites' means and variances)
and wires them together.
"""

import functools
import inspect
import math
import numbers
import time
import warnings
import weakref
from collections.abc import Callable
from typing import NamedTuple

import pyro
import torch
from pyro.infer.autoguide.initialization import init_to_feasible
from pyro.infer.inspect import get_dependencies
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.utils import _pytree as pytree

from ..infer.errors import DivergenceError
from ..infer.potential import ParticlePotential, check_model_data
from ..infer.tracing import (
    ModelNotTraceableError,
    check_jit_compile,
    compile_graph,
    contiguous,
    data_spec,
    trace_pure,
)
from ..ops.curvature import hessian_diagonal
from ..ops.random import device_random_state, rng_preserved, set_device_random_state
from ..ops.validation import check_choice, check_int, check_real
from . import updates
from .updates import DiagBelief, DLRBelief, FullBelief, NotPositiveDefiniteError

FAMILIES = ("full", "diag", "dlr")
METHODS = ("bong", "blr", "bog", "bbb")
HESSIANS = ("lin", "mc", "ef")
#: (learning_rate, num_iters) when not given: BONG's and BOG's single step; BLR's and
#: BBB's damped inner iterations (see the class docstring)
DEFAULTS = {"bong": (1.0, 1), "blr": (0.5, 10), "bog": (0.003, 1), "bbb": (0.003, 10)}
#: the smallest variance used to whiten a residual (a Bernoulli mean at 0 or 1)
_TINY = 1e-12


class OnlineDivergenceError(DivergenceError):
    """
    Raised when an update leaves the belief non-finite or its precision not positive
    definite. The belief stays the one before the update.

    :ivar int step: the (0-based) update that failed.
    """

    def __init__(self, step, what):
        self.step = step
        super().__init__(
            f"online update {step} failed: {what}. The belief is the one before this "
            "update. For BOG/BBB lower learning_rate; for hessian='mc' use 'lin' or 'ef' "
            "(never indefinite); check the data for NaN or inf inputs."
        )


class IMQ:
    r"""
    The inverse multi-quadric weight of WoLF (Duran-Martin et al. 2024, "Outlier-robust
    Kalman filtering through generalised Bayes"): an observation with residual :math:`r =
    y - \hat y` against the predicted mean (the prior predictive's) has the IMQ
    :math:`W = (1 + \lVert r\rVert^2 / c^2)^{-1/2}`, and the paper's loss is
    :math:`-W^2 \log p(y \mid \theta)`: its log-likelihood counts

    .. math:: W^2 = \frac{c^2}{c^2 + \lVert r\rVert^2}

    times in the update, i.e. :math:`R` becomes :math:`R / W^2` in the Kalman update (the
    paper's WoLF algorithm for a linear-Gaussian model; the authors' code,
    ``rebayes-mini``'s ``ExtendedKalmanFilterIMQ``, computes exactly
    ``c**2 / (c**2 + err @ err)``). ``c`` is the soft threshold, in the units of ``y``;
    ``c = inf`` weighs every observation 1.

    :param float c: the soft threshold, ``> 0`` (``inf`` allowed).
    :param bool squared: ``True`` (default) weighs the log-likelihood by :math:`W^2`, the
        paper's; ``False`` by the IMQ :math:`W` itself, the weight this package used before
        (not the paper's: an outlier far out keeps weight :math:`c / \lVert r\rVert`
        instead of :math:`c^2 / \lVert r\rVert^2`, so it pulls harder).
    """

    def __init__(self, c: float, squared: bool = True):
        # c = inf weighs every observation 1 (the plain filter).
        self.c = check_real(
            c, "c (the soft threshold of the residual)", low=0, low_open=True, finite=False
        )
        if not isinstance(squared, bool):
            raise TypeError(f"squared must be a bool, got {type(squared).__name__}")
        self.squared = squared

    def __call__(self, squared_residual: torch.Tensor) -> torch.Tensor:
        """The weight of each example's log-likelihood, from its ``squared_residual``."""
        if self.squared:
            # c^2 / (c^2 + r^2), written as 1 / (1 + r^2 / c^2) so that c = inf gives 1.
            return (1 + squared_residual / self.c**2).reciprocal()
        return (1 + squared_residual / self.c**2).rsqrt()

    def __repr__(self):
        return f"IMQ(c={self.c})" if self.squared else f"IMQ(c={self.c}, squared=False)"


def _placeholder(fn):
    """A value of ``fn``'s shape for an output with no value (its log-density is unused)."""
    value = torch.zeros(fn.shape(), device=_device_of(fn))
    if isinstance(_base(fn), torch.distributions.Categorical):
        value = value.long()
    return value


def _is_deterministic(msg):
    """A ``pyro.deterministic`` site: Pyro records it as an observed Delta, but it is a
    function of the latent sites, never an observation."""
    return bool(msg["infer"].get("_deterministic"))


class _OutputsObserved(Messenger):
    """Marks the sites named in ``outputs`` that the call gives no value as observed at a
    placeholder, so that reading a model on prediction inputs (no observations) does not
    take its outputs for latent sites."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = frozenset(outputs)

    def _process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.outputs and not msg["is_observed"]:
            msg["value"] = _placeholder(msg["fn"])
            msg["is_observed"] = True


class _Observations(Messenger):
    """
    Runs the model at given latent values and records its observed sites: the
    distribution, the value (missing entries, NaN, replaced by the distribution's mean so
    that nothing downstream turns NaN), which examples are missing or masked. Sites named
    in ``outputs`` that have no value (a prediction) get a placeholder instead of a draw.
    """

    def __init__(self, values, outputs=()):
        super().__init__()
        self.values = values
        self.outputs = frozenset(outputs)
        self.sites = {}

    def _process_message(self, msg):
        msg["stop"] = True
        if msg["type"] != "sample" or site_is_subsample(msg) or _is_deterministic(msg):
            return
        name = msg["name"]
        if name in self.values:
            msg["value"] = self.values[name]
            msg["is_observed"] = True
            return
        if not msg["is_observed"] and name in self.outputs:
            msg["value"] = _placeholder(msg["fn"])
            msg["is_observed"] = True
            msg["infer"]["_placeholder"] = True
            return
        if msg["is_observed"] and msg["value"].is_floating_point():
            missing = torch.isnan(msg["value"])
            # A traced update fills whatever the values (it cannot branch on them).
            if updates.checks_deferred() or bool(missing.any()):
                fill = msg["fn"].mean.detach()
                msg["value"] = torch.where(missing, torch.nan_to_num(fill), msg["value"])
                msg["infer"]["_missing"] = missing

    def _postprocess_message(self, msg):
        if (
            msg["type"] != "sample"
            or site_is_subsample(msg)
            or _is_deterministic(msg)
            or msg["name"] in self.values
        ):
            return
        if not msg["is_observed"]:
            raise ValueError(
                f"site {msg['name']!r} is neither a latent site of the belief nor observed: "
                "pass its value to update() (the model's structure must stay the same)"
            )
        self.sites[msg["name"]] = msg


def _with_outputs_observed(model, outputs):
    """``model`` with the sites ``outputs`` read as observed when they have no value; it
    keeps the model's declared start (``default_init_strategy``)."""

    def wrapped(*args, **kwargs):
        with _OutputsObserved(outputs):
            return model(*args, **kwargs)

    declared = getattr(model, "default_init_strategy", None)
    if declared is not None:
        wrapped.default_init_strategy = declared
    return wrapped


def _base(fn):
    while isinstance(fn, torch.distributions.Independent):
        fn = fn.base_dist
    return fn


def _device_of(fn):
    for value in vars(fn).values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _example_weights(site, robust, residual_sq):
    """Weights ``fn.batch_shape`` of one observed site's examples: 0 missing or masked."""
    fn = site["fn"]
    weight = torch.ones(fn.batch_shape, dtype=residual_sq.dtype, device=residual_sq.device)
    extra = len(site["value"].shape) - len(fn.batch_shape)
    missing = site["infer"].get("_missing")
    if missing is not None:
        if extra:
            missing = missing.reshape(missing.shape[: missing.dim() - extra] + (-1,)).any(-1)
        weight = weight * (~missing)
    if site["mask"] is not None:
        weight = weight * torch.as_tensor(site["mask"], device=weight.device).expand_as(weight)
    if robust is not None:
        weight = weight * robust(residual_sq)
    return weight


# -- the data contract of one batch ---------------------------------------------------------
class OnlineInputError(OnlineDivergenceError, ValueError):
    """
    Raised when :meth:`BONG.update` refuses a batch whose inputs hold NaN or infinite
    values (an observation's NaN is a missing value and is skipped; an input's is not). It
    is a :class:`ValueError` (a wrong value of an argument) and, as such inputs always
    stopped the update, an :class:`OnlineDivergenceError`. The belief stays the one before
    the update.
    """

    def __init__(self, step, what):
        self.step, self.what = step, what
        Exception.__init__(
            self,
            f"update {step} refused: {what}. The belief is the one before this update.",
        )

    def __reduce__(self):
        return type(self), (self.step, self.what)


#: model -> its signature, read once per model (every update binds its arguments); weak,
#: so that it keeps no model (nor the data a model closes over) alive
_SIGNATURES = weakref.WeakKeyDictionary()


def _signature(model):
    try:
        return _SIGNATURES[model]
    except (KeyError, TypeError):  # not seen yet, or not weakly referenceable
        pass
    try:
        signature = inspect.signature(model)
    except (TypeError, ValueError):
        signature = None
    try:
        _SIGNATURES[model] = signature
    except TypeError:
        pass
    return signature


def _bind(model, args, kwargs, what):
    """``{argument name: value}`` of ``model(*args, **kwargs)`` with its defaults, to name
    the arguments in messages; a model whose signature ``*args`` hides gets positions."""
    signature = _signature(model)
    if signature is None:
        return {f"#{i}": a for i, a in enumerate(args)} | dict(kwargs)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(
            f"{what} passes its arguments to the model, model{signature}, which cannot take "
            f"them ({error})"
        ) from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _label(name):
    return f"positional argument {name[1:]}" if name.startswith("#") else repr(name)


def _tensor_leaves(bound):
    """``(label, tensor)`` of every tensor among the bound arguments (nested too)."""
    for name, value in bound.items():
        leaves = torch.utils._pytree.tree_leaves(value)
        for position, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                yield (name if len(leaves) == 1 else f"{name}[{position}]"), leaf


def _storage(tensor):
    """The address of ``tensor``'s storage: a view of an argument (``y[:, None]``) shares it."""
    return tensor.untyped_storage().data_ptr() if tensor.numel() else None


def _first_index(bad):
    return tuple(int(i) for i in bad.nonzero()[0])


def _nonfinite(label, leaf, allow_nan=False):
    """``"the model's argument 'x' has NaN first at index (2, 1)"``, or ``None``."""
    if not (leaf.is_floating_point() or leaf.is_complex()):
        return None
    bad = ~torch.isfinite(leaf)
    if allow_nan:
        bad = bad & ~torch.isnan(leaf)
    if not bool(bad.any()):
        return None
    kind = "NaN" if bool(leaf[bad].isnan().any()) else "an infinite value"
    return f"the model's argument {_label(label)} has {kind} first at index {_first_index(bad)}"


def _none_arguments(bound):
    return [name for name, value in bound.items() if value is None and not name.startswith("#")]


def _shapes(bound):
    parts = []
    for label, leaf in _tensor_leaves(bound):
        parts.append(f"{label}: {tuple(leaf.shape)} {str(leaf.dtype).replace('torch.', '')}")
    return ", ".join(parts) or "no tensors"


def _support_fill(fn, value):
    """A number in ``fn``'s support, to stand for the missing (NaN) observations when the
    potential's data contract reads them (the filter skips them; NaN is not in a support)."""
    for candidate in (0.0, 1.0, 0.5):
        filled = torch.full_like(value, candidate)
        try:
            if bool(fn.support.check(filled).all()):
                return candidate
        except (RuntimeError, ValueError, TypeError):
            continue
    return 0.0


#: the keys of :meth:`BONG.state_dict`, and of its belief in each family
_STATE_KEYS = ("family", "belief", "num_updates", "observed_sites", "fingerprint")
_BELIEF_KEYS = {
    "full": ("mean", "covariance"),
    "diag": ("mean", "precision"),
    "dlr": ("mean", "diagonal", "low_rank"),
}


def _model_fingerprint(potential, point):
    """``{site: {"distribution", "support", "shape"}}`` of the model's latent sites, read
    by one run at ``point`` (nothing drawn)."""
    with (
        rng_preserved(),
        torch.no_grad(),
        pyro.validation_enabled(False),
        pyro.poutine.block(),
    ):
        model = pyro.poutine.condition(potential.model, data=potential.constrain(point))
        trace = pyro.poutine.trace(model).get_trace(*potential.model_args, **potential.model_kwargs)
    return {
        name: {
            "distribution": type(_base(trace.nodes[name]["fn"])).__name__,
            "support": str(trace.nodes[name]["fn"].support),
            "shape": tuple(trace.nodes[name]["value"].shape),
        }
        for name in potential.layout
    }


def _compare_models(saved, mine):
    """Refuse a state saved from another model, naming the first difference."""
    if not isinstance(saved, dict) or list(saved) != list(mine):
        names = list(saved) if isinstance(saved, dict) else saved
        raise ValueError(
            f"the state was saved from a model with latent sites {names!r}, this filter's "
            f"model has {list(mine)}; a state resumes the model it was saved from"
        )
    for name, items in mine.items():
        theirs = saved[name] if isinstance(saved[name], dict) else {}
        for item, value in items.items():
            other = theirs.get(item)
            if item == "shape" and isinstance(other, (list, tuple)):
                other = tuple(other)
            if other != value:
                raise ValueError(
                    f"the state was saved from another model: latent site {name!r} has "
                    f"{item} {other!r} there, {value!r} here; a state resumes the model it "
                    "was saved from"
                )


def _check_belief_state(belief, family, rank):
    """The belief of a state: the family's keys, floating tensors, finite, consistent
    shapes, a positive (definite) precision (covariance for the full family)."""
    if not isinstance(belief, dict):
        raise TypeError(f"state['belief'] must be a dict of tensors, got {type(belief).__name__}")
    keys = _BELIEF_KEYS[family]
    if family == "full" and "precision" in belief and "covariance" not in belief:
        raise ValueError(
            "state['belief'] holds a 'precision': it was saved before the full family kept "
            "its covariance. Convert it before loading: state['belief']['covariance'] = "
            "torch.linalg.inv(state['belief'].pop('precision'))"
        )
    missing = [key for key in keys if key not in belief]
    extra = [key for key in belief if key not in keys]
    if missing or extra:
        which = f"has no key {missing[0]!r}" if missing else f"has the unknown key {extra[0]!r}"
        raise ValueError(
            f"state['belief'] {which}; a {family!r} belief has exactly the keys {list(keys)}"
        )
    for key in keys:
        value = belief[key]
        name = f"state['belief'][{key!r}]"
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
        bad = ~torch.isfinite(value)
        if bool(bad.any()):
            raise ValueError(
                f"{name} is not finite (first at index {_first_index(bad)}); a belief saved by "
                "BONG.state_dict() is always finite"
            )
    mean = belief["mean"]
    if mean.dim() != 1:
        raise ValueError(f"state['belief']['mean'] must be a vector (D,), got {tuple(mean.shape)}")
    dim = mean.shape[0]
    expected = {"mean": (dim,)}
    if family == "full":
        expected["covariance"] = (dim, dim)
    elif family == "diag":
        expected["precision"] = (dim,)
    else:
        expected["diagonal"], expected["low_rank"] = (dim,), (dim, rank)
    for key, shape in expected.items():
        if tuple(belief[key].shape) != shape:
            raise ValueError(
                f"state['belief'][{key!r}] has shape {tuple(belief[key].shape)}; with a mean "
                f"of {dim} coordinates{f' and rank {rank}' if family == 'dlr' else ''} it "
                f"must be {shape}"
            )
    if family == "full":
        covariance = belief["covariance"].to(torch.float64)
        _, info = torch.linalg.cholesky_ex(0.5 * (covariance + covariance.T))
        if bool(info.any()) or not torch.allclose(covariance, covariance.T):
            raise ValueError(
                "state['belief']['covariance'] is not a symmetric positive-definite matrix"
            )
        return
    positive = belief["diagonal"] if family == "dlr" else belief["precision"]
    if not bool((positive > 0).all()):
        key = "diagonal" if family == "dlr" else "precision"
        raise ValueError(
            f"state['belief'][{key!r}] must be positive, got {positive.min().item()!r} first "
            f"at index {_first_index(positive <= 0)}"
        )


class OnlinePredictions(NamedTuple):
    r"""
    The one-step-ahead predictions of a stream, :meth:`BONG.update_many`'s result: step
    ``t``'s are made from the belief after the first ``t`` observations.
    """

    #: the linearised predictive mean :math:`h(\mu)` of the observed site, its steps
    #: concatenated along the first dimension (``{site: mean}`` for several sites)
    mean: torch.Tensor | dict
    #: :math:`\mathrm{diag}(H \Sigma H^\top) + R`, laid out as ``mean``
    variance: torch.Tensor | dict
    #: ``(T,)``: each observation's predictive log-density: Normal sites under
    #: :math:`\mathcal N(\text{mean}, \text{variance})`, Bernoulli and Categorical ones
    #: under the predictive probabilities, others at the predicted mean (plug-in)
    log_likelihood: torch.Tensor


class _Graph(NamedTuple):
    """A traced update: the callable and whether it replays CUDA graphs."""

    fn: Callable
    cudagraphs: bool


class BONG:
    r"""
    An online Gaussian belief over the continuous latent sites of a Pyro model
    ``model(*args)`` (e.g. ``model(x, y=None)``), updated one observation or minibatch at
    a time by Bayesian online natural gradient (Jones, Chang & Murphy 2024) or its
    relatives. The belief lives in the sites' unconstrained space, flattened to ``D``
    coordinates as the SG-MCMC kernels lay them out
    (:class:`~pyro_ext.infer.potential.ParticlePotential`).

    Each :meth:`update` moves the belief towards the expected log-likelihood of the new
    data (see :mod:`~pyro_ext.online.updates` for the four rules' formulas):

    * ``linearize=True`` (EKF-style, deterministic): the observed site's mean :math:`h`
      is linearised at the belief's mean, :math:`H = \partial h / \partial\theta`, its
      variance :math:`R` held there: :math:`g = H^\top R^{-1}(y - \hat y)` and the
      Hessian is ``hessian="lin"`` :math:`-H^\top R^{-1} H` or ``"ef"`` (the empirical
      Fisher of the linearised per-example gradients). A Categorical site is linearised
      in its logits (the same thing, without the singular :math:`R`). For a
      linear-Gaussian model, BONG-LIN is exactly the Kalman filter.
    * ``linearize=False``: Monte Carlo expectations over ``num_samples`` draws from the
      belief, in antithetic pairs :math:`\mu \pm \epsilon` (unbiased as plain draws are,
      and exact for a gradient linear in :math:`\theta`): ``hessian="mc"`` (default for
      ``"full"`` and ``"diag"``: the exact Hessian at each draw, dense for ``"full"``, its
      diagonal for ``"diag"``) or ``"ef"``. On a linear-Gaussian model the defaults are
      exact whatever ``num_samples`` (the Hessian is the same at every draw, the pairs
      average the linear gradient to its value at the mean); a network's Hessian is
      indefinite, so pass ``hessian="ef"`` there. ``"dlr"`` has only ``"ef"``, which is not
      exact even for a linear-Gaussian model, so it must be asked for.

    **Priors.** Latent sites with a fixed Normal prior (a network's weights) give the
    initial precision directly. Any other site needs a Gaussian prior on its
    unconstrained coordinate: ``unconstrained_prior={"sigma": (loc, scale)}``. The belief
    starts as the prior: its mean is the prior mean (the fixed Normal's ``loc``, the
    ``unconstrained_prior``'s), so on a linear-Gaussian model every update is exact Bayes.
    A network at its prior mean of zeros is a saddle point, where the Jacobian of its
    output with respect to the weights is zero and the linearised update never moves
    them (the first update warns when it finds such sites): start it away from zero with
    ``init_strategy=init_to_sample`` (the random start the LoFi and BONG papers give
    networks; the belief is then the prior's covariance around that draw), a
    :class:`~pyro_ext.models.BayesianMLP`'s ``net.init_strategy()``, or a start the model
    declares (``model.default_init_strategy``, as
    :func:`~pyro_ext.online.neural_contextual_model` does). The linearised update only
    learns the sites the observed mean depends on (a noise scale inside ``R`` is not
    learned by it; use ``linearize=False``, or observe it). A ``pyro.deterministic``
    site is a function of the latent sites, never an observation.

    :param callable model: a Pyro model with continuous latent sites and static
        structure; each call of :meth:`update` passes one batch of data (no subsampled
        plates: a filter sees each datum once).
    :param str family: ``"full"`` (dense covariance: ``O(D^2 P)`` for BONG's linearised or
        empirical-Fisher update of ``P < D`` outputs, the Kalman form; ``O(D^3)`` for a
        dense Hessian, BLR, BOG and BBB), ``"diag"`` or ``"dlr"``
        (diagonal plus rank-``rank`` precision, LoFi: ``O(D rank^2)``).
    :param int rank: the low rank ``L`` of ``"dlr"``, in ``[1, D]`` (default 10).
    :param str method: ``"bong"`` (one natural-gradient step from the prior; default),
        ``"blr"`` (``num_iters`` damped natural steps on the ELBO), ``"bog"`` (one
        gradient step in :math:`(\mu, \Sigma)`), ``"bbb"`` (``num_iters`` of them). BOG
        and BBB have the full and diagonal families.
    :param bool linearize: linearised (default) or Monte Carlo expectations.
    :param int num_samples: draws per expectation when ``linearize=False``, an even
        number (antithetic pairs; default 10).
    :param str hessian: ``"lin"`` (the linearised Hessian; default when linearising),
        ``"mc"`` (the Hessian at the draws; default with ``linearize=False`` for the
        ``"full"`` and ``"diag"`` families: exact for a linear-Gaussian model, but a
        network's is indefinite, and the precision soon stops being positive definite) or
        ``"ef"`` (the empirical Fisher: never indefinite, not exact; the only choice of
        ``"dlr"`` with ``linearize=False``, where it must be passed).
    :param float learning_rate: the rate :math:`\alpha`. Defaults: 1 for BONG (exact in
        the conjugate case), 0.5 for BLR, 0.003 for BOG and BBB. Their step adds
        :math:`\tfrac{\alpha}{2} G` to the covariance, which leaves the positive-definite
        cone once :math:`\alpha \lVert G\rVert` outgrows the shrinking covariance (the
        update then raises :class:`OnlineDivergenceError`): on a 65-weight network and
        two moons, 0.003 lasts 1,000 observations with the diagonal family and about 400
        with the full one (Jones et al. find BOG and BBB the weakest of the four).
    :param int num_iters: inner steps of BLR and BBB (default 10; BONG and BOG take 1).
    :param robust: ``None`` or an :class:`IMQ` weight (WoLF).
    :param dynamics: ``None`` (static parameters) or ``("random_walk", q)``: the
        parameters follow :math:`\theta_t = \theta_{t-1} + \mathcal N(0, q I)` (``q >
        0``), tracking drifting parameters. As in the extended Kalman filter, each
        :meth:`update` first predicts (the covariance grows by :math:`q I`, before the
        first update too) and then conditions on the data; :meth:`predictive` and
        :meth:`predicted_belief` give that predicted belief's view of the next
        observation, :attr:`mean`, :meth:`covariance` and :meth:`sample` the filtered
        belief after the last update.
    :param callable init_strategy: a Pyro init strategy for the initial mean, which then
        replaces the prior mean (see **Priors**; default: the start the model declares, see
        :meth:`~pyro_ext.infer.potential.ParticlePotential.declared_init_strategy`, else the
        prior mean).
    :param dict unconstrained_prior: ``site -> (loc, scale)`` Gaussian priors on the
        unconstrained coordinates of sites whose prior is not a fixed Normal.
    :param int jacobian_chunk_size: rows of the Jacobian of the observed means computed
        per vectorised pass (``None``: all at once; smaller saves memory).
    :param jit_compile: ``False`` (default: each update runs op by op), ``True`` (the
        update traced once per batch shape, with the model, its Jacobian or Hessian, the
        family's step, the robust weights and the drift, into one graph compiled by
        TorchInductor; the first update of a filter runs eagerly) or ``"trace"`` (the
        traced graph uncompiled). The compiled update gives the eager one's belief to
        float32 round-off (the Monte Carlo draws are drawn as the eager update draws them
        and passed in). The batch's checks are the eager update's: its shapes and dtypes
        once per new shape, its values (finite inputs, observations inside their support)
        inside the graph, and an update whose checks or arithmetic fail there (a refused
        batch, a precision that is not positive definite) is redone eagerly, which raises
        the eager error. A model that cannot be traced (it branches on a tensor's value)
        warns and runs eagerly. Compiling takes a few seconds (the first time; inductor
        caches it on disk), which a stream of more than a few thousand updates repays (see
        ``benchmarks/online.py``).
    :param str compile_mode: :func:`torch.compile`'s mode with ``jit_compile=True``
        (``None``: the default on the CPU, ``"reduce-overhead"``, one CUDA graph per
        update, on CUDA).
    :param int unroll: with ``jit_compile``, the observations :meth:`update_many` filters
        per compiled call, one after the other in one graph (``lax.scan``'s ``unroll``;
        default 1). A longer unroll saves part of each call's fixed cost (at D = 65,
        ``unroll=4`` takes the full filter from 54 to 41 µs per observation) but compiles a
        graph that many times larger (9-18 s from a cold cache, against 2-5 s): it pays
        after about a million observations, and not at all once the arithmetic dominates
        (D in the hundreds); ``benchmarks/online.py`` measures both.
    """

    def __init__(
        self,
        model: Callable,
        family: str = "full",
        rank: int | None = None,
        method: str = "bong",
        linearize: bool = True,
        num_samples: int | None = None,
        hessian: str | None = None,
        learning_rate: float | None = None,
        num_iters: int | None = None,
        robust: IMQ | None = None,
        dynamics: tuple | None = None,
        init_strategy: Callable | None = None,
        unconstrained_prior: dict | None = None,
        jacobian_chunk_size: int | None = None,
        jit_compile: bool | str = False,
        compile_mode: str | None = None,
        unroll: int = 1,
    ):
        if not callable(model):
            raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
        _check_choice("family", family, FAMILIES)
        _check_choice("method", method, METHODS)
        if not isinstance(linearize, bool):
            raise TypeError(f"linearize must be a bool, got {type(linearize).__name__}")
        if rank is not None:
            if family != "dlr":
                raise ValueError(f"rank applies to family='dlr', not family={family!r}")
            _check_int("rank", rank, 1)
        if family == "dlr" and method in ("bog", "bbb"):
            raise ValueError(
                f"method={method!r} (a gradient step in the covariance) has the 'full' and "
                "'diag' families; for 'dlr' use method='bong' or 'blr'"
            )
        if num_samples is not None:
            if linearize:
                raise ValueError(
                    "num_samples applies to Monte Carlo expectations: pass linearize=False"
                )
            _check_int("num_samples", num_samples, 2)
            if num_samples % 2:
                raise ValueError(
                    "num_samples must be even: the Monte Carlo draws come in antithetic "
                    f"pairs mean +- eps, got {num_samples}"
                )
        if hessian is None:
            if linearize:
                hessian = "lin"
            elif family == "dlr":
                raise ValueError(
                    "family='dlr' with linearize=False has only the empirical Fisher "
                    "(hessian='ef'), which is not exact even for a linear-Gaussian model: "
                    "pass hessian='ef' to use it, or linearize=True (LoFi's update)"
                )
            else:
                hessian = "mc"
        _check_choice("hessian", hessian, HESSIANS)
        if hessian == "lin" and not linearize:
            raise ValueError("hessian='lin' is the linearised Hessian: it needs linearize=True")
        if hessian == "mc" and linearize:
            raise ValueError("hessian='mc' is the Monte Carlo Hessian: pass linearize=False")
        if hessian == "mc" and family == "dlr":
            raise ValueError(
                "family='dlr' needs a low-rank Hessian: hessian='lin' (linearize=True) or 'ef'"
            )
        default_lr, default_iters = DEFAULTS[method]
        if learning_rate is None:
            learning_rate = default_lr
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real):
            raise TypeError(f"learning_rate must be a number, got {type(learning_rate).__name__}")
        if not (0 < learning_rate <= 1 if method in ("bong", "blr") else 0 < learning_rate):
            raise ValueError(
                f"learning_rate must lie in (0, 1] for natural steps (> 0 for BOG/BBB), "
                f"got {learning_rate!r}"
            )
        if num_iters is None:
            num_iters = default_iters
        _check_int("num_iters", num_iters, 1)
        if num_iters > 1 and method in ("bong", "bog"):
            raise ValueError(
                f"method={method!r} takes one step by definition; num_iters applies to "
                "'blr' and 'bbb'"
            )
        if robust is not None and not isinstance(robust, IMQ):
            raise TypeError(f"robust must be None or an IMQ weight, got {type(robust).__name__}")
        self.drift = None
        if dynamics is not None:
            if (
                not isinstance(dynamics, tuple)
                or len(dynamics) != 2
                or dynamics[0] != "random_walk"
            ):
                raise ValueError(
                    f"dynamics must be None or ('random_walk', q) with q > 0, got {dynamics!r}"
                )
            q = dynamics[1]
            if isinstance(q, bool) or not isinstance(q, numbers.Real):
                raise TypeError(f"the drift variance q must be a number, got {type(q).__name__}")
            if not (math.isfinite(q) and q > 0):
                raise ValueError(f"the drift variance q must be finite and > 0, got {q!r}")
            self.drift = float(q)
        if init_strategy is not None and not callable(init_strategy):
            raise TypeError("init_strategy must be a Pyro init strategy (a callable)")
        if unconstrained_prior is not None:
            _check_unconstrained_prior(unconstrained_prior)
        if jacobian_chunk_size is not None:
            _check_int("jacobian_chunk_size", jacobian_chunk_size, 1)
        self.model = model
        self.family, self.method, self.hessian = family, method, hessian
        self.rank = 10 if (family == "dlr" and rank is None) else rank
        self.linearize = linearize
        self.num_samples = 10 if (not linearize and num_samples is None) else num_samples
        self.learning_rate, self.num_iters = float(learning_rate), num_iters
        self.robust = robust
        self.init_strategy = init_strategy
        self.unconstrained_prior = dict(unconstrained_prior or {})
        self.jacobian_chunk_size = jacobian_chunk_size
        self.jit_compile = check_jit_compile(jit_compile, compile_mode)
        self.compile_mode = compile_mode
        self.unroll = _check_int("unroll", unroll, 1)
        #: the traced (compiled) updates, by the batch's shapes: ``_Graph`` entries
        self._graphs = {}
        #: seconds spent tracing and compiling updates (compile time, not update time)
        self.trace_seconds = 0.0
        self.compile_seconds = 0.0
        self.potential = None
        self.belief = None
        self.observed_sites = None
        #: the observed sites :meth:`predictive` found before the first update
        self._prediction_outputs = ()
        self.num_updates = 0
        self._loaded_state = None
        #: the model's fingerprint (its latent sites), read at set-up, kept in a state
        self._fingerprint = None

    # -- set-up --------------------------------------------------------------------------
    def _setup(self, args, kwargs, outputs=()):
        """
        Read the model on ``args``/``kwargs`` and set the prior belief. ``outputs``: sites
        that these arguments leave without a value but that are observations (a
        :meth:`predictive` call before the first update), read as observed.
        """
        model = self.model
        if outputs:
            model = _with_outputs_observed(self.model, outputs)
        potential = ParticlePotential(model, args, kwargs, vectorize="vmap", check_data=False)
        if potential.subsample_sizes:
            raise ValueError(
                f"the model subsamples plate(s) {sorted(potential.subsample_sizes)}: an online "
                "filter sees each datum once, so pass each batch to update() and leave "
                "subsample_size out of the model's plates"
            )
        strategy = self.init_strategy
        if strategy is None:
            strategy = potential.declared_init_strategy()
        # The belief starts as the prior: its mean is the prior mean, unless a start is
        # given or declared. The priors are read at a feasible point (a fixed Normal's
        # parameters do not depend on where), which draws no random numbers.
        start_at_prior = strategy is None
        point = potential.initial_particles(1, init_to_feasible if start_at_prior else strategy)[0]
        priors = potential.fixed_normal_priors(point)
        if start_at_prior:
            point = torch.where(priors.columns, priors.mean, point)
        precision = priors.precision.clone()
        unknown = [name for name in self.unconstrained_prior if name not in potential.layout]
        if unknown:
            raise ValueError(
                f"unconstrained_prior names site(s) {unknown} that are not latent sites of "
                f"the model (they are {list(potential.layout)})"
            )
        missing = []
        for name, layout in potential.layout.items():
            columns = slice(layout.start, layout.end)
            if name in self.unconstrained_prior:
                loc, scale = (
                    torch.as_tensor(v, dtype=point.dtype, device=point.device)
                    for v in self.unconstrained_prior[name]
                )
                shape = layout.unconstrained_shape
                for part, value in (("loc", loc), ("scale", scale)):
                    try:
                        fits = torch.broadcast_shapes(value.shape, shape) == shape
                    except RuntimeError:
                        fits = False
                    if not fits:
                        raise ValueError(
                            f"unconstrained_prior[{name!r}]: the {part} has shape "
                            f"{tuple(value.shape)}, which does not broadcast to the site's "
                            f"unconstrained shape {tuple(shape)}"
                        )
                precision[columns] = scale.expand(shape).reshape(-1).pow(-2)
                if self.init_strategy is None:
                    point[columns] = loc.expand(shape).reshape(-1)
            elif not bool(priors.columns[columns].all()):
                missing.append(name)
        if missing and not outputs:
            bound = _bind(self.model, args, kwargs, "update()")
            if _none_arguments(bound):
                # A leaf of the model's graph (a site that depends on others, and no other
                # on it) without a value while an argument is None: the observation was
                # left out (update(x) for update(x, y)).
                try:
                    leaves = set(self._find_outputs(args, kwargs))
                except ValueError:
                    leaves = set()
                unobserved = [name for name in missing if name in leaves]
                if unobserved:
                    raise self._missing_observation(unobserved, bound, "update()")
        if missing:
            raise ValueError(
                f"latent site(s) {missing} have no fixed Normal prior; a Gaussian belief needs "
                "a Gaussian prior on each site's unconstrained coordinates: pass "
                "unconstrained_prior={site: (loc, scale)} (e.g. for a positive scale, a "
                "Normal on its log), or make the prior a Normal with constant parameters"
            )
        dim = point.shape[-1]
        if self.family == "dlr" and self.rank > dim:
            raise ValueError(
                f"rank must be at most the number of parameters D = {dim}, got {self.rank}"
            )
        if self.family == "full":
            belief = FullBelief(point, torch.diag(precision.reciprocal()).to(torch.float64))
        elif self.family == "diag":
            belief = DiagBelief(point, precision)
        else:
            belief = DLRBelief(point, precision, point.new_zeros(dim, self.rank))
        fingerprint = _model_fingerprint(potential, point)
        num_updates, observed_sites = self.num_updates, self.observed_sites
        if self._loaded_state is not None:
            # Checked against this model before anything is set: a refused state leaves
            # the filter as it was (and refused again at the next call).
            belief, num_updates, observed_sites = self._restore(
                self._loaded_state, belief, fingerprint
            )
            self._loaded_state = None
        # Prediction inputs read the outputs as observed at set-up only; later runs (an
        # update's data, the predictive's placeholders) go to the model itself.
        potential.model = self.model
        self.potential, self.belief, self._fingerprint = potential, belief, fingerprint
        self.num_updates, self.observed_sites = num_updates, observed_sites

    # -- the data contract of each batch ------------------------------------------------------
    def _trace_batch(self, args, kwargs, what):
        """
        One run of the model on a batch, read before the filter uses it: at the belief's
        mean once there is one (the latent sites conditioned), else from the prior, with
        torch's random state restored (the check draws nothing the filter would).
        """
        model = self.model
        if self.potential is not None and self.belief is not None:
            model = pyro.poutine.condition(model, data=self.potential.constrain(self.belief.mean))
        with (
            # Every update runs this: torch's generators only (Pyro models draw from them).
            rng_preserved(python_and_numpy=False),
            torch.no_grad(),
            pyro.validation_enabled(False),
            pyro.poutine.block(),
        ):
            try:
                return pyro.poutine.trace(model).get_trace(*args, **kwargs)
            except ZeroDivisionError as error:
                # pyro.plate of size 0: a batch with no rows.
                bound = _bind(self.model, args, kwargs, what)
                empty = [label for label, leaf in _tensor_leaves(bound) if leaf.numel() == 0]
                raise ValueError(
                    f"{what} got no data: the model's argument(s) "
                    f"{', '.join(repr(n) for n in empty) or '(none found)'} are empty "
                    f"({_shapes(bound)}); pass at least one observation"
                ) from error
            except (RuntimeError, IndexError, AttributeError) as error:
                # A shape or dtype the model cannot combine: say which arguments it got.
                first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
                kind = TypeError if isinstance(error, AttributeError) else ValueError
                bound = _bind(self.model, args, kwargs, what)
                latents = (
                    {n: tuple(s.unconstrained_shape) for n, s in self.potential.layout.items()}
                    if self.potential is not None
                    else None
                )
                raise kind(
                    f"{what}: the model failed on these arguments ({type(error).__name__}: "
                    f"{first_line}); they were {_shapes(bound)}"
                    + (f", and the belief's latent sites are {latents}" if latents else "")
                    + ". Pass tensors of the shapes and dtypes the model takes"
                ) from error

    def _check_batch(self, args, kwargs, what="update()"):
        """
        The data contract of one batch, run once per :meth:`update` (not per inner step):
        every observed site has a value (its argument is not ``None``) and is not infinite
        (NaN is a missing observation, skipped); at least one observation; the inputs are
        finite. Then the one contract of every entry point,
        :func:`~pyro_ext.infer.potential.check_model_data` (support, dtype, exact shape), on
        the batch with the missing observations filled in (the filter skips them; the
        contract would refuse NaN).
        """
        bound = _bind(self.model, args, kwargs, what)
        trace = self._trace_batch(args, kwargs, what)
        owner = {}
        for label, leaf in _tensor_leaves(bound):
            owner.setdefault(_storage(leaf), label)
        observed, unobserved = {}, []
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site) or _is_deterministic(site):
                continue
            if site["is_observed"]:
                observed[name] = site
            elif self.potential is not None and name not in self.potential.layout:
                unobserved.append(name)
        if unobserved:
            raise self._missing_observation(unobserved, bound, what)
        if self.potential is not None and not observed:
            raise ValueError(
                f"{what} found no observed site: pass the observations to the model "
                "(e.g. update(x, y))"
            )
        observation_storages = set()
        for name, site in observed.items():
            value = site["value"]
            label = owner.get(_storage(value)) if isinstance(value, torch.Tensor) else None
            source = f" (the model's argument {_label(label)})" if label else ""
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"observed site {name!r}{source} must be a tensor, got {type(value).__name__}"
                )
            if value.numel() == 0:
                raise ValueError(
                    f"{what} got no data: observed site {name!r}{source} has shape "
                    f"{tuple(value.shape)}, with no element; pass at least one observation"
                )
            if label is not None:
                observation_storages.add(_storage(value))
            elif value.is_floating_point() and bool(torch.isinf(value).any()):
                raise OnlineInputError(
                    self.num_updates,
                    f"observed site {name!r} holds an infinite value first at index "
                    f"{_first_index(torch.isinf(value))}; its values are not finite",
                )
        for label, leaf in _tensor_leaves(bound):
            problem = _nonfinite(label, leaf, allow_nan=_storage(leaf) in observation_storages)
            if problem:
                raise OnlineInputError(
                    self.num_updates,
                    f"{problem}; its values are not finite. Drop or impute those rows (NaN "
                    "in an observation is a missing value, which the filter skips; NaN or inf "
                    "in an input is not)",
                )
        self._check_model_data(args, kwargs, trace, observed, bound)
        return observation_storages

    def _check_model_data(self, args, kwargs, trace, observed, bound):
        """The potential's data contract on the batch, the missing observations filled in."""
        fills = {}
        for site in observed.values():
            value = site["value"]
            if value.is_floating_point() and bool(torch.isnan(value).any()):
                fill = _support_fill(site["fn"], value)
                fills[_storage(value)] = fill
                site["value"] = torch.where(torch.isnan(value), fill, value)
        if fills:

            def filled(leaf):
                if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                    fill = fills.get(_storage(leaf))
                    if fill is not None:
                        return torch.where(torch.isnan(leaf), fill, leaf)
                return leaf

            args, kwargs = torch.utils._pytree.tree_map(filled, (tuple(args), dict(kwargs)))
        with torch.no_grad():
            check_model_data(self.model, tuple(args), dict(kwargs), trace)

    def _missing_observation(self, sites, bound, what):
        """The error of a call that leaves observed sites without a value."""
        missing = _none_arguments(bound)
        if missing:
            return ValueError(
                f"{what} got no observation for site(s) {sites}: the model's argument(s) "
                f"{', '.join(repr(n) for n in missing)} are None (missing), so the model "
                "would sample those sites instead of observing them. Pass the observed "
                "values, e.g. update(x, y)"
            )
        return ValueError(
            f"{what}: site(s) {sites} are neither latent sites of the belief nor observed: "
            "pass their observed values (the model's structure must stay the same)"
        )

    # -- the model's observed sites ---------------------------------------------------------
    def _run(self, theta, outputs=()):
        values = self.potential.constrain(theta)
        with pyro.validation_enabled(False), _Observations(values, outputs) as observations:
            self.potential.run_model(None, None)
        return observations.sites

    def _linear_terms(self, theta):
        r"""
        Whitened outputs ``u`` ``(P,)`` (whose Jacobian at ``theta`` is the factor ``A``
        with :math:`A^\top A = H^\top R^{-1} H`), the whitened residuals ``e`` ``(P,)``
        (:math:`A^\top e = H^\top R^{-1} (y - \hat y)`), the example of each output, and the
        examples' weights at ``theta`` (missing, masked, WoLF's IMQ of the residual).
        """
        outputs, residuals, examples, weights = [], [], [], []
        offset = 0
        sites = self._observed(theta)
        for name, site in sites.items():
            fn, value = site["fn"], site["value"]
            base = _base(fn)
            if isinstance(base, torch.distributions.Categorical):
                logits = base.logits
                p = logits.softmax(-1).detach()
                root = p.clamp_min(_TINY).sqrt()
                factor = torch.diag_embed(root) - p.unsqueeze(-1) * root.unsqueeze(-2)
                u = (factor.transpose(-1, -2) @ logits.unsqueeze(-1)).squeeze(-1)
                raw = torch.nn.functional.one_hot(value, p.shape[-1]).to(p.dtype) - p
                e = raw / root
            elif isinstance(base, torch.distributions.Bernoulli):
                logits = base.logits
                p = logits.sigmoid().detach()
                root = (p * (1 - p)).clamp_min(_TINY).sqrt()
                u, raw = root * logits, value - p
                e = raw / root
            else:
                try:
                    mean, variance = base.mean, base.variance.detach()
                except NotImplementedError:
                    raise ValueError(
                        f"observed site {name!r} is a {type(base).__name__}, which has no mean "
                        "and variance to linearise: pass linearize=False"
                    ) from None
                updates.require(
                    torch.isfinite(variance) & (variance > 0),
                    lambda name=name, base=base: ValueError(
                        f"observed site {name!r} ({type(base).__name__}) has a variance that is "
                        "not finite and positive (a Student-t needs df > 2): pass "
                        "linearize=False"
                    ),
                )
                root = variance.sqrt()
                u = mean / root
                raw = value - mean.detach()
                e = raw / root
            # One example per element of the site's batch shape; its outputs are the rest.
            batch = fn.batch_shape
            u = u.expand(raw.shape).reshape(batch.numel(), -1)
            num = batch.numel()
            squared = raw.detach().reshape(num, -1).square().sum(-1).reshape(batch)
            weights.append(_example_weights(site, self.robust, squared).reshape(-1))
            outputs.append(u)
            residuals.append(e.reshape(num, -1))
            examples.append(
                torch.arange(offset, offset + num, device=u.device)
                .unsqueeze(-1)
                .expand(u.shape)
                .reshape(-1)
            )
            offset += num
        u = torch.cat([x.reshape(-1) for x in outputs])
        e = torch.cat([x.reshape(-1) for x in residuals])
        return u, (e.detach(), torch.cat(examples), torch.cat(weights))

    def _observed(self, theta):
        """The observed sites at ``theta``; records their names at the first update."""
        sites = self._run(theta)
        if not sites:
            raise ValueError(
                "update() found no observed site: pass the observations to the model "
                "(e.g. update(x, y))"
            )
        if self.observed_sites is None:
            self.observed_sites = tuple(sites)
        return sites

    def _example_weights(self, sites):
        """Per-example weights from the sites at the predicted mean: missing, masked, IMQ."""
        weights = []
        for site in sites.values():
            fn, value = site["fn"], site["value"]
            base = _base(fn)
            if isinstance(base, torch.distributions.Categorical):
                raw = torch.nn.functional.one_hot(value, base.probs.shape[-1]) - base.probs
            else:
                raw = value - base.mean
            num = fn.batch_shape.numel()
            squared = raw.detach().reshape(num, -1).square().sum(-1).reshape(fn.batch_shape)
            weights.append(_example_weights(site, self.robust, squared).reshape(-1))
        return torch.cat(weights)

    def _log_likelihoods(self, theta, weights):
        """Weighted per-example log-likelihoods ``(B,)`` at ``theta`` ``(D,)``."""
        terms = []
        for site in self._run(theta).values():
            fn = site["fn"]
            terms.append(fn.log_prob(site["value"]).expand(fn.batch_shape).reshape(-1))
        return torch.cat(terms) * weights

    def _expectations(self, belief, weights, noise=None):
        """
        ``(grad, factor, hessian, weights, coefficients)`` of the expected log-likelihood
        under ``belief``, ``grad`` being ``factor^T coefficients`` where there is a factor
        (``coefficients`` ``None`` otherwise); ``weights=None`` reads the examples' weights
        at the belief's mean (the predicted mean, at an update's first inner step) from the
        same model run.
        ``noise``: the Monte Carlo expectations' standard normal draws (a traced update
        takes them as inputs), else drawn here.
        """
        chunk = self.jacobian_chunk_size
        if self.linearize and self.hessian == "ef":
            # The empirical Fisher needs only the per-example gradients J_i^T (w_i e_i): one
            # vector-Jacobian product per example, not one per output (a classifier's C).
            _, pullback, (e, examples, weights_here) = torch.func.vjp(
                lambda theta: self._linear_terms(theta), belief.mean, has_aux=True
            )
            if weights is None:
                weights = weights_here
            weighted = weights[examples] * e
            num_examples = weights.shape[0]
            selector = examples == torch.arange(num_examples, device=examples.device).unsqueeze(-1)
            (per_example,) = torch.func.vmap(pullback, chunk_size=chunk)(selector * weighted)
            ones = per_example.new_ones(per_example.shape[0])
            return per_example.sum(0), per_example, None, weights, ones
        if self.linearize:
            jacobian, (e, examples, weights_here) = torch.func.jacrev(
                lambda theta: self._linear_terms(theta), has_aux=True, chunk_size=chunk
            )(belief.mean)
            if weights is None:
                weights = weights_here
            root = weights.sqrt()[examples]
            A, e = jacobian * root.unsqueeze(-1), e * root
            grad = A.transpose(-1, -2) @ e
            return grad, A, None, weights, e
        # Antithetic pairs: exact for a gradient linear in theta (a linear-Gaussian model).
        draws = updates.sample(belief, self.num_samples, antithetic=True, noise=noise)

        def log_likelihood(theta):
            return self._log_likelihoods(theta, weights)

        # One vectorised pass over the draws (torch.func.vmap of the model, as the
        # SG-MCMC kernels evaluate particles).
        per_example = torch.func.vmap(torch.func.jacrev(log_likelihood))(draws).mean(0)
        grad = per_example.sum(0)
        if self.hessian == "ef":
            return grad, per_example, None, weights, per_example.new_ones(per_example.shape[0])

        def total(points):
            return torch.func.vmap(lambda theta: log_likelihood(theta).sum())(points).sum()

        if self.family == "full":
            hessian = torch.func.vmap(torch.func.hessian(lambda t: log_likelihood(t).sum()))(
                draws
            ).mean(0)
        else:
            hessian = hessian_diagonal(total, draws).mean(0)
        return grad, None, hessian, weights, None

    # -- the public interface ---------------------------------------------------------------
    def setup(self, *args, **kwargs) -> "BONG":
        """
        Read the model on its arguments and set the prior belief (the first :meth:`update`
        does it otherwise). The mean is the prior mean; only an ``init_strategy`` (given or
        declared by the model) that draws consumes random numbers.
        """
        self._check_batch(args, kwargs, "setup()")
        self._setup(args, kwargs)
        return self

    def _hyperparameters(self) -> dict:
        """What a state's belief depends on besides the model: the filter's class and the
        arguments of its update (not its start, ``init_strategy``, nor the memory knob
        ``jacobian_chunk_size``)."""
        return {
            "class": type(self).__name__,
            "family": self.family,
            "rank": self.rank,
            "method": self.method,
            "linearize": self.linearize,
            "num_samples": self.num_samples,
            "hessian": self.hessian,
            "learning_rate": self.learning_rate,
            "num_iters": self.num_iters,
            "robust": repr(self.robust),
            "dynamics": self.drift,
        }

    def state_dict(self) -> dict:
        """
        The belief and the update count, to checkpoint a long stream (``torch.save``);
        :meth:`load_state_dict` on a filter built with the same arguments resumes it. The
        state carries a fingerprint of the model (its latent sites' names, distributions,
        supports and shapes) and of the filter (:meth:`_hyperparameters`), which
        :meth:`load_state_dict` compares with its own.
        """
        self._require_belief()
        return {
            "family": self.family,
            "belief": {
                k: v.detach().clone(memory_format=torch.contiguous_format)
                for k, v in self.belief._asdict().items()
            },
            "num_updates": self.num_updates,
            "observed_sites": self.observed_sites,
            "fingerprint": {"model": self._fingerprint, "filter": self._hyperparameters()},
        }

    def load_state_dict(self, state: dict) -> "BONG":
        """
        Resume from :meth:`state_dict`. The state is checked now against this filter (its
        keys, its belief's tensors: finite, positive-definite precision, consistent shapes;
        the filter's hyperparameters) and, when the model is read (at once if it already
        has been, else at the next :meth:`setup`, :meth:`update` or :meth:`predictive`,
        which then start from this belief), against the model's latent sites.

        :raises TypeError: if ``state`` or one of its entries has the wrong type.
        :raises ValueError: if a key is missing or extra, a value is not finite or of the
            wrong shape, or the state was saved by another filter or model.
        """
        if not isinstance(state, dict):
            raise TypeError(
                f"state must be a dict from BONG.state_dict(), got {type(state).__name__}"
            )
        missing = [key for key in _STATE_KEYS if key not in state]
        extra = [key for key in state if key not in _STATE_KEYS]
        if missing or extra:
            raise ValueError(
                f"state {'has no key ' + repr(missing[0]) if missing else 'has the unknown key ' + repr(extra[0])}"
                f"; a state from BONG.state_dict() has exactly the keys {list(_STATE_KEYS)}"
            )
        if state["family"] != self.family:
            raise ValueError(
                f"the state is of family {state['family']!r}, this filter's is {self.family!r}"
            )
        fingerprint = state["fingerprint"]
        if not (
            isinstance(fingerprint, dict)
            and isinstance(fingerprint.get("filter"), dict)
            and isinstance(fingerprint.get("model"), dict)
        ):
            raise TypeError(
                "state['fingerprint'] must be a dict {'model': ..., 'filter': ...} from "
                f"BONG.state_dict(), got {fingerprint!r:.80}"
            )
        mine = self._hyperparameters()
        for key in list(mine) + [k for k in fingerprint["filter"] if k not in mine]:
            theirs = fingerprint["filter"].get(key, "(missing)")
            if theirs != mine.get(key, "(missing)"):
                raise ValueError(
                    f"the state was saved by a filter with {key}={theirs!r}, this one has "
                    f"{key}={mine.get(key, '(missing)')!r}; load it into a filter built with "
                    "the same arguments"
                )
        num_updates = state["num_updates"]
        check_int(num_updates, "state['num_updates']", low=0)
        observed = state["observed_sites"]
        if observed is not None and not (
            isinstance(observed, (tuple, list)) and all(isinstance(n, str) for n in observed)
        ):
            raise TypeError(
                f"state['observed_sites'] must be None or a tuple of site names, got {observed!r:.80}"
            )
        _check_belief_state(state["belief"], self.family, self.rank)
        if self.potential is None:
            self._loaded_state = state
        else:
            self.belief, self.num_updates, self.observed_sites = self._restore(
                state, self.belief, self._fingerprint
            )
        return self

    def _restore(self, state, template, fingerprint):
        """The state's ``(belief, num_updates, observed_sites)`` for this model, whose
        fingerprint and prior belief ``template`` it must match."""
        _compare_models(state["fingerprint"]["model"], fingerprint)
        values = {}
        for name, value in template._asdict().items():
            saved = state["belief"][name]
            if saved.shape != value.shape:
                raise ValueError(
                    f"the state's belief[{name!r}] has shape {tuple(saved.shape)}, this model's "
                    f"belief needs {tuple(value.shape)}"
                )
            values[name] = saved.to(dtype=value.dtype, device=value.device)
        observed = state["observed_sites"]
        return (
            type(template)(**values),
            int(state["num_updates"]),
            None if observed is None else tuple(observed),
        )

    def update(self, *args, **kwargs) -> "BONG":
        """
        Condition the belief on one batch of data: the model's arguments, with the observed
        values (e.g. ``update(x_t, y_t)``). Observations that are NaN are skipped (they
        get weight 0, as a Kalman filter skips a missing measurement), as are those the
        model masks with ``pyro.poutine.mask``. Returns ``self``.

        The batch is checked first, once (not at each inner step): every observed site
        needs a value (an argument left ``None`` is named), of its distribution's shape,
        inside its support; the batch is not empty; the inputs hold no NaN or inf, nor the
        observations inf (:class:`OnlineInputError`, a :class:`ValueError` naming the
        argument and the first bad index); then the potential's data contract,
        :func:`~pyro_ext.infer.potential.check_model_data`. A refused batch leaves the
        belief as it was.
        """
        if self._compiles():
            if self._compiled_update(args, kwargs) is not None:
                return self
        return self._eager_update(args, kwargs)

    def _eager_update(self, args, kwargs, predict=False):
        """The update run op by op (``predict``: also return :meth:`_step_predictions`)."""
        # The batch's data contract, once per update (the inner steps reuse the batch).
        self._check_batch(args, kwargs)
        if self.potential is None:
            self._setup(args, kwargs)
        else:
            self.potential.set_data(*args, **kwargs)
        try:
            prior, current = self._step(self.belief)
            if predict:
                with torch.no_grad():
                    predictions = self._step_predictions(prior)
        except NotPositiveDefiniteError as error:
            raise OnlineDivergenceError(self.num_updates, str(error)) from None
        if not all(bool(torch.isfinite(x).all()) for x in current):
            raise OnlineDivergenceError(self.num_updates, "the belief is not finite")
        self.belief = current
        self.num_updates += 1
        return predictions if predict else self

    def _step(self, belief, noises=None):
        """
        The arithmetic of one update from the filtered ``belief`` on the potential's current
        data, shared by the eager and the traced update: the drift's prediction, then the
        rule's inner steps. ``noises``: the Monte Carlo draws of each inner step (a traced
        update's inputs), else drawn as it goes. Returns ``(predicted, updated)`` beliefs.
        """
        prior = belief
        if self.drift is not None:
            prior = updates.predict_random_walk(prior, self.drift)
        # Linearised: the weights come from the first Jacobian's model run (one run fewer
        # per update); Monte Carlo: from a run at the predicted mean.
        weights = None if self.linearize else self._example_weights(self._observed(prior.mean))
        current = prior
        for inner in range(self.num_iters):
            noise = None if noises is None else noises[inner]
            grad, factor, hessian, weights, coefficients = self._expectations(
                current, weights, noise
            )
            if (
                self.num_updates == 0
                and inner == 0
                and factor is not None
                and self.linearize
                and not updates.checks_deferred()
            ):
                self._warn_if_at_a_saddle(prior, factor)
            updates.require(
                torch.isfinite(grad),
                lambda: OnlineDivergenceError(
                    self.num_updates,
                    "the expected gradient of the log-likelihood is not finite (NaN or "
                    "inf in the inputs, or a model that overflows at the current belief)",
                ),
            )
            if self.method in ("bong", "blr"):
                current = updates.natural_step(
                    current,
                    prior,
                    grad,
                    factor,
                    hessian,
                    self.learning_rate,
                    self.rank,
                    coefficients,
                )
            else:
                current = updates.euclidean_step(
                    current, prior, grad, factor, hessian, self.learning_rate
                )
        return prior, current

    def _step_predictions(self, prior):
        r"""
        The one-step-ahead view of the current data from the predicted belief ``prior``:
        ``{site: (mean, variance)}`` as :meth:`predictive` linearises them, and the
        predictive log-likelihood of the observations: a Normal site scored under
        :math:`\mathcal N(h(\mu), \mathrm{diag}(H \Sigma H^\top) + R)` (the Kalman filter's
        one-step-ahead density, so for a linear-Gaussian model the sum over a stream is
        the exact log marginal likelihood), a Bernoulli or Categorical one under its
        linearised predictive probabilities, any other at the predicted mean (plug-in).
        Missing and masked observations score 0.
        """
        moments = self._linearised_moments(prior, self.observed_sites)
        total = prior.mean.new_zeros(())
        for name, site in self._run(prior.mean).items():
            mean, variance = moments[name]
            value, base = site["value"], _base(site["fn"])
            if isinstance(base, torch.distributions.Categorical):
                log_p = mean.clamp_min(_TINY).log().gather(-1, value.unsqueeze(-1)).squeeze(-1)
            elif isinstance(base, torch.distributions.Bernoulli):
                p = mean.clamp(_TINY, 1 - _TINY)
                log_p = value * p.log() + (1 - value) * (-p).log1p()
            elif isinstance(base, torch.distributions.Normal):
                log_p = torch.distributions.Normal(mean, variance.sqrt(), validate_args=False)
                log_p = log_p.log_prob(value)
            else:
                log_p = base.log_prob(value)
            missing = site["infer"].get("_missing")
            if missing is not None:
                log_p = torch.where(missing, torch.zeros_like(log_p), log_p)
            if site["mask"] is not None:
                log_p = log_p * site["mask"]
            total = total + log_p.sum()
        return moments, total

    # -- the traced (compiled) update ----------------------------------------------------------
    def _compiles(self):
        """Whether the next update goes through a traced graph: ``jit_compile`` is on and the
        first update (which reads the model, and warns about a saddle start) is done."""
        return bool(self.jit_compile) and self.potential is not None and self.num_updates > 0

    def _compiled_update(self, args, kwargs, predict=False, steps=1):
        """
        One update through the traced graph of the batch's shapes (traced, and compiled, at
        the first batch of those shapes, after the batch's full eager checks). Returns the
        step's predictions (``()`` without ``predict``), or ``None`` when the update must run
        eagerly: the graph flagged it (its checks or arithmetic failed; the random state is
        put back, so the eager update draws the same), or the model cannot be traced.
        ``steps > 1``: ``args`` and ``kwargs`` hold that many observations along their
        tensors' first dimension, filtered one at a time in one graph call (``update_many``'s
        chunks; the predictions come stacked); ``None`` leaves the belief as it was.
        """
        leaves, spec, key = data_spec(args, kwargs)
        key = (key, predict, steps)
        graph = self._graphs.get(key)
        if graph is None:
            first = (args, kwargs) if steps == 1 else _stream_slice(leaves, spec, 0, 1)
            storages = self._check_batch(*first)  # the eager contract, once per shape
            self.potential.set_data(*first[0], **first[1])
            try:
                graph = self._graphs[key] = self._trace_update(
                    leaves, spec, storages, predict, steps
                )
            except ModelNotTraceableError as error:
                warnings.warn(
                    f"{error} This filter runs its updates eagerly from now on.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                self.jit_compile = False
                return None
        data = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        belief = self.belief
        noises, random_state = [], None
        if not self.linearize:
            # Drawn as the eager update draws them, one inner step after the other.
            random_state = device_random_state(belief.mean.device)
            half = (self.num_samples // 2,) + belief.mean.shape
            noises = [
                torch.randn(half, dtype=belief.mean.dtype, device=belief.mean.device)
                for _ in range(self.num_iters * steps)
            ]
        if graph.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        outputs = graph.fn(*contiguous(belief), *noises, *data)
        if graph.cudagraphs:
            # A CUDA graph's outputs live in its memory, which the next replay overwrites.
            outputs = [output.clone() for output in outputs]
        size = len(belief)
        if not bool(outputs[size]):
            if random_state is not None:
                set_device_random_state(belief.mean.device, random_state)
            return None
        self.belief = type(belief)(*outputs[:size])
        self.num_updates += steps
        # What the eager update's set_data would leave (predictive() and the checks read it).
        if steps > 1:
            args, kwargs = _stream_slice(leaves, spec, steps - 1, steps)
        self.potential.model_args, self.potential.model_kwargs = tuple(args), dict(kwargs)
        predictions = outputs[size + 1 :]
        if not predict:
            return ()
        names = self.observed_sites
        moments = {n: (predictions[2 * i], predictions[2 * i + 1]) for i, n in enumerate(names)}
        return moments, predictions[-1]

    def _trace_update(self, leaves, spec, observation_storages, predict, steps=1):
        """Trace :meth:`_step` (and the batch's value checks, and with ``predict`` the
        step's predictions) as a function of the belief, the noise and the data's tensors.
        ``steps > 1``: the tensors hold ``steps`` observations along their first dimension,
        filtered one after the other in the one graph (unrolled, as ``lax.scan``'s
        ``unroll``); the predictions come stacked."""
        belief = self.belief
        belief_type, num_belief = type(belief), len(belief)
        num_noise = 0 if self.linearize else self.num_iters
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        # NaN is a missing observation in an observed value, an error in any other input.
        nan_allowed = [_storage(t) in observation_storages for t in tensors]
        with torch.no_grad(), pyro.validation_enabled(False):
            fills = {
                name: _support_fill(site["fn"], site["value"])
                for name, site in self._run(belief.mean).items()
            }
        potential = self.potential

        def one_step(belief, noises, data, flags):
            given = iter(data)
            args, kwargs = pytree.tree_unflatten(
                [next(given) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
                spec,
            )
            potential.model_args, potential.model_kwargs = tuple(args), dict(kwargs)
            # The batch's values, as _check_batch reads them.
            for tensor, nan_ok in zip(data, nan_allowed):
                if tensor.is_floating_point():
                    flags.append((~tensor.isinf() if nan_ok else tensor.isfinite()).all())
            for name, site in self._run(belief.mean).items():
                value, missing = site["value"], site["infer"].get("_missing")
                if value.is_floating_point():
                    flags.append((~value.isinf()).all())
                if missing is not None:
                    value = torch.where(missing, torch.full_like(value, fills[name]), value)
                flags.append(site["fn"].support.check(value).all())
            prior, current = self._step(belief, noises)
            extras = ()
            if predict:
                moments, log_likelihood = self._step_predictions(prior)
                extras = (*(x for n in self.observed_sites for x in moments[n]), log_likelihood)
            flags.extend(torch.isfinite(x).all() for x in current)
            return current, extras

        def update(*inputs):
            belief = belief_type(*inputs[:num_belief])
            noises = inputs[num_belief : num_belief + num_noise * steps]
            data = inputs[num_belief + num_noise * steps :]
            saved = potential.model_args, potential.model_kwargs
            per_step = []
            try:
                with updates.deferred_checks() as flags:
                    for k in range(steps):
                        step_data = data if steps == 1 else [t[k : k + 1] for t in data]
                        step_noises = noises[k * num_noise : (k + 1) * num_noise] or None
                        belief, extras = one_step(belief, step_noises, step_data, flags)
                        per_step.append(extras)
            finally:
                potential.model_args, potential.model_kwargs = saved
            if steps == 1:
                (extras,) = per_step
            else:
                # Each step's moments have its batch of one first; its log-likelihood is a
                # scalar: stacked along the steps.
                extras = tuple(
                    torch.stack(column) if column[0].dim() == 0 else torch.cat(column)
                    for column in zip(*per_step)
                )
            # A chain of ands, which the graph fuses into its kernels (a stacked vector of
            # the flags cost a buffer and a view per flag at every call: 4 us of 31 at D = 65).
            return (*belief, functools.reduce(torch.logical_and, flags), *extras)

        inputs = contiguous(belief)
        if num_noise:
            half = (self.num_samples // 2,) + belief.mean.shape
            inputs += [belief.mean.new_zeros(half) for _ in range(num_noise * steps)]
        inputs += tensors
        started = time.perf_counter()
        graph = trace_pure(update, inputs, "build the filter with jit_compile=False")
        self.trace_seconds += time.perf_counter() - started
        if self.jit_compile == "trace":
            return _Graph(graph, False)
        fn, seconds, cudagraphs = compile_graph(
            graph, inputs, self.compile_mode, "update", contiguous_inputs=True
        )
        self.compile_seconds += seconds
        return _Graph(fn, cudagraphs)

    def update_many(self, *args, **kwargs) -> "OnlinePredictions":
        r"""
        Filter a whole stream in one call: every tensor argument holds the stream along its
        first dimension (``T`` observations, e.g. ``update_many(X, Y)`` with ``X`` ``(T,
        d)`` and ``Y`` ``(T,)``), and the belief is updated with one observation at a time,
        exactly as ``T`` calls ``update(X[t : t + 1], Y[t : t + 1])`` would (the same
        beliefs and checks). With ``jit_compile=True`` they go through a compiled graph
        ``unroll`` at a time (one by default), which also computes the predictions below;
        the stream's last ``T mod unroll`` observations, and a chunk in which a check
        fails, run one at a time.

        Returns :class:`OnlinePredictions`: for each step, the one-step-ahead prediction of
        its observation from the belief before it (what a Kalman filter reports): the
        linearised predictive mean and variance of each observed site, as
        :meth:`predictive` gives them, and the predictive log-likelihood of the observation
        (see :class:`OnlinePredictions`). For a linear-Gaussian model the log-likelihoods
        sum to the stream's exact log marginal likelihood. A refused observation raises as
        :meth:`update` does; the updates before it stand.
        """
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        labelled = list(_tensor_leaves(_bind(self.model, args, kwargs, "update_many()")))
        if not labelled:
            raise ValueError("update_many() got no tensor argument: pass the stream, e.g. (X, Y)")
        lengths = {label: (leaf.shape[0] if leaf.dim() else None) for label, leaf in labelled}
        if len(set(lengths.values())) != 1 or None in lengths.values():
            raise ValueError(
                "update_many() takes a stream: every tensor argument must have the same "
                "leading dimension, the observations' index; got "
                + ", ".join(
                    f"{_label(label)} of shape {tuple(leaf.shape)}" for label, leaf in labelled
                )
            )
        length = next(iter(lengths.values()))
        if length == 0:
            raise ValueError("update_many() got an empty stream (0 observations)")
        if not kwargs and all(isinstance(arg, torch.Tensor) for arg in args):
            # Tensors only (the common stream): cut them without the general unflattening,
            # which costs microseconds per observation.
            def cut(start, stop):
                return tuple(arg[start:stop] for arg in args), {}

        else:

            def cut(start, stop):
                return _stream_slice(leaves, spec, start, stop)

        pieces = []  # (moments, log-likelihoods) of one step or of a chunk of `unroll`
        t, unroll = 0, self.unroll
        while t < length:
            if unroll > 1 and length - t >= unroll and self._compiles():
                chunk_args, chunk_kwargs = cut(t, t + unroll)
                result = self._compiled_update(chunk_args, chunk_kwargs, True, unroll)
                if result is not None:
                    pieces.append(result)
                    t += unroll
                    continue
            # One at a time: the remainder after the chunks, or a chunk whose graph flagged
            # a step (its refusal or divergence then comes from that step's own update).
            for _ in range(min(unroll, length - t)):
                step_args, step_kwargs = cut(t, t + 1)
                result = None
                if self._compiles():
                    result = self._compiled_update(step_args, step_kwargs, predict=True)
                if result is None:
                    result = self._eager_update(step_args, step_kwargs, predict=True)
                moments, total = result
                pieces.append((moments, total.reshape(1)))
                t += 1
        names = self.observed_sites
        means = {n: torch.cat([moments[n][0] for moments, _ in pieces]) for n in names}
        variances = {n: torch.cat([moments[n][1] for moments, _ in pieces]) for n in names}
        log_likelihood = torch.cat([totals for _, totals in pieces])
        if len(names) == 1:
            (name,) = names
            return OnlinePredictions(means[name], variances[name], log_likelihood)
        return OnlinePredictions(means, variances, log_likelihood)

    def _warn_if_at_a_saddle(self, prior, factor):
        """
        Warn when the first linearised update finds latent sites that the observations do
        not depend on at the start (all their Jacobian columns zero) but do depend on at a
        draw from the prior: a network at its zero prior mean, which the linearised update
        would never move.
        """
        flat = factor.reshape(-1, factor.shape[-1])
        stuck = [
            name
            for name, site in self.potential.layout.items()
            if not bool(flat[:, site.start : site.end].any())
        ]
        if not stuck:
            return
        # A fixed seed: the check leaves the global random state alone.
        generator = torch.Generator(device=prior.mean.device).manual_seed(0)
        draw = updates.sample(prior, 1, generator)[0]
        jacobian, (_, examples, weights) = torch.func.jacrev(
            lambda theta: self._linear_terms(theta),
            has_aux=True,
            chunk_size=self.jacobian_chunk_size,
        )(draw)
        # Only the examples the update uses (a missing or masked one has weight 0).
        jacobian = jacobian * (weights[examples] > 0).unsqueeze(-1)
        layout = self.potential.layout
        saddle = [
            name for name in stuck if bool(jacobian[:, layout[name].start : layout[name].end].any())
        ]
        if saddle:
            warnings.warn(
                f"the observations do not depend on latent site(s) {saddle} at the start of "
                "the belief (their Jacobian is zero there, as a network's at its prior mean "
                "of zeros) but do away from it: the linearised update will never learn them. "
                "Start the belief away from that point, e.g. init_strategy=init_to_sample "
                "(from pyro.infer.autoguide), or declare model.default_init_strategy",
                UserWarning,
                stacklevel=5,
            )

    def _require_belief(self):
        if self.belief is None:
            raise RuntimeError(
                "no belief yet: the filter reads the model at its first update() (or at "
                "setup(*args), or predictive(*args)), which sets the prior belief"
            )

    def predicted_belief(self):
        r"""
        The belief the next :meth:`update` starts from, whose view of the next observation
        :meth:`predictive` gives: with ``dynamics=("random_walk", q)``, the filtered belief
        after the drift, covariance :math:`\Sigma + q I` (the Kalman filter's predict
        step); without dynamics, the belief itself.
        """
        self._require_belief()
        if self.drift is None:
            return self.belief
        return updates.predict_random_walk(self.belief, self.drift)

    @property
    def mean(self) -> torch.Tensor:
        """The belief's mean ``(D,)`` in flat unconstrained space."""
        self._require_belief()
        return self.belief.mean

    def covariance(self) -> torch.Tensor:
        """The belief's dense covariance ``(D, D)``, formed on demand."""
        self._require_belief()
        return updates.covariance(self.belief)

    def sample(self, num_samples: int = 1000, generator=None) -> dict[str, torch.Tensor]:
        """
        ``num_samples`` draws of every latent site, in constrained space: ``{site:
        (num_samples, *shape)}``, the form :class:`pyro.infer.Predictive` takes as
        ``posterior_samples``.
        """
        self._require_belief()
        _check_int("num_samples", num_samples, 1)
        _check_generator(generator)
        with torch.no_grad():
            return self.potential.constrain(updates.sample(self.belief, num_samples, generator))

    def site_posteriors(self, num_samples: int = 4096) -> dict[str, tuple]:
        """
        ``{site: (loc, scale)}`` marginals in constrained space: exact for real-valued
        sites; constrained sites from ``num_samples`` draws of a fixed seed (leaving the
        global random state alone).
        """
        self._require_belief()
        _check_int("num_samples", num_samples, 1)
        return self.potential.site_marginals(
            self.belief.mean,
            updates.marginal_variance(self.belief).sqrt(),
            lambda n, generator: updates.sample(self.belief, n, generator),
            num_samples,
        )

    def predictive(self, *args, num_samples: int | None = None, noise: bool = True, **kwargs):
        r"""
        One-step-ahead predictive mean and variance of the observed site at new inputs
        (e.g. ``predictive(x)``), under :meth:`predicted_belief` (the belief after the
        dynamics' drift, :math:`\Sigma + qI`, as the Kalman filter predicts before it
        updates): ``(mean, variance)`` shaped as the site's mean (a Categorical: class
        probabilities ``(..., C)`` and their variances). ``num_samples=None`` linearises,
        :math:`h(\mu)` and :math:`\mathrm{diag}(H \Sigma H^\top) + R`; otherwise the mean
        and variance over ``num_samples`` draws of the belief (total variance).
        ``noise=False`` leaves out the observation noise (:math:`R`, the draws' own
        variances): the variance of the mean alone, what a UCB bonus needs. A model with
        several observed sites gives ``{site: (mean, variance)}``.

        Before the first :meth:`update` it is the prior predictive: the model is read on
        these inputs, its observed sites being the sample sites that depend on others and
        that no other site depends on (the leaves of the model's graph, as
        :func:`pyro.infer.inspect.get_dependencies` finds them).
        """
        if not isinstance(noise, bool):
            raise TypeError(f"noise must be a bool, got {type(noise).__name__}")
        if num_samples is not None:
            _check_int("num_samples", num_samples, 1)
        # The inputs of a prediction must be finite: a NaN input gives a NaN prediction.
        for label, leaf in _tensor_leaves(_bind(self.model, args, kwargs, "predictive()")):
            problem = _nonfinite(label, leaf)
            if problem:
                raise ValueError(
                    f"predictive(): {problem}; a prediction at a non-finite input is NaN. "
                    "Drop or impute those rows"
                )
        if self.potential is None:
            self._prediction_outputs = self._find_outputs(args, kwargs)
            self._setup(args, kwargs, self._prediction_outputs)
        outputs = self.observed_sites or self._prediction_outputs
        args_before, kwargs_before = self.potential.model_args, self.potential.model_kwargs
        self.potential.model_args, self.potential.model_kwargs = tuple(args), dict(kwargs)
        try:
            result = self._predict(outputs, num_samples, noise)
        except (RuntimeError, IndexError) as error:
            # A shape or dtype the model cannot combine with the belief's latent sites.
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            latents = {n: tuple(s.unconstrained_shape) for n, s in self.potential.layout.items()}
            raise ValueError(
                f"predictive(): the model failed on these arguments ({type(error).__name__}: "
                f"{first_line}); they were {_shapes(_bind(self.model, args, kwargs, 'predictive()'))}"
                f", and the belief's latent sites are {latents}. Pass inputs of the shapes and "
                "dtypes of update()'s"
            ) from error
        finally:
            self.potential.model_args, self.potential.model_kwargs = args_before, kwargs_before
        return result if len(result) > 1 else next(iter(result.values()))

    def _find_outputs(self, args, kwargs):
        """The observed sites of a model called without observations: the sample sites
        (not deterministic) that depend on another site and that no other depends on."""
        try:
            with pyro.validation_enabled(False):
                dependencies = get_dependencies(self.model, args, kwargs)["prior_dependencies"]
        except Exception as error:  # the dependency tracer cannot run every model
            raise ValueError(
                "predictive() before the first update() reads which sites are observations "
                f"from the model's dependencies, which failed here ({error}): call "
                "setup(*args) with the observations first (e.g. setup(x, y))"
            ) from error
        upstream = {
            name: set(parents) - {name}
            for name, parents in dependencies.items()
            if name not in self.unconstrained_prior
        }
        needed = set().union(*upstream.values()) if upstream else set()
        outputs = tuple(
            name for name, parents in upstream.items() if parents and name not in needed
        )
        if not outputs:
            raise ValueError(
                "predictive() before the first update() found no observed site (a sample "
                "site that depends on the latent sites); call setup(*args) with the "
                "observations first (e.g. setup(x, y))"
            )
        return outputs

    def _moments(self, theta, outputs):
        """The observed sites' means and variances at ``theta`` (class probabilities and
        their variances for a Categorical)."""
        sites = self._run(theta, outputs)
        means, variances = {}, {}
        for name, site in sites.items():
            base = _base(site["fn"])
            if isinstance(base, torch.distributions.Categorical):
                p = base.probs
                means[name], variances[name] = p, p * (1 - p)
            else:
                means[name], variances[name] = base.mean, base.variance
        return means, variances

    def _linearised_moments(self, belief, outputs, noise=True):
        r""":math:`h(\mu)` and :math:`\mathrm{diag}(H \Sigma H^\top)` (+ :math:`R` with
        ``noise``) of each observed site under ``belief``."""
        mean = belief.mean
        means, variances = self._moments(mean, outputs)
        result = {}
        for name in means:
            shape = means[name].shape

            def flat_mean(theta, name=name):
                return self._moments(theta, outputs)[0][name].reshape(-1)

            jacobian = torch.func.jacrev(flat_mean, chunk_size=self.jacobian_chunk_size)(mean)
            spread = updates.quadratic_diagonal(belief, jacobian).reshape(shape)
            result[name] = (means[name], variances[name] + spread if noise else spread)
        return result

    def _predict(self, outputs, num_samples, noise):
        belief = self.predicted_belief()
        with torch.no_grad():
            if num_samples is not None:
                draws = updates.sample(belief, num_samples)
                per_draw = [self._moments(theta, outputs) for theta in draws]
                result = {}
                for name in per_draw[0][0]:
                    m = torch.stack([d[0][name] for d in per_draw])
                    v = torch.stack([d[1][name] for d in per_draw])
                    spread = m.var(0, unbiased=False)
                    result[name] = (m.mean(0), v.mean(0) + spread if noise else spread)
                return result
        return {
            name: (m.detach(), v.detach())
            for name, (m, v) in self._linearised_moments(belief, outputs, noise).items()
        }


def _stream_slice(leaves, spec, start, stop):
    """The model's ``(args, kwargs)`` with every tensor leaf cut to ``[start:stop]``."""
    args, kwargs = pytree.tree_unflatten(
        [leaf[start:stop] if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec
    )
    return args, kwargs


def _check_choice(name, value, choices):
    return check_choice(value, name, choices)


def _check_int(name, value, low):
    return check_int(value, name, low=low)


def _check_unconstrained_prior(priors):
    """``unconstrained_prior``: a dict ``site -> (loc, scale)`` of finite numbers or real
    tensors, each ``scale > 0`` (its shapes are checked against the site at set-up)."""
    if not isinstance(priors, dict):
        raise TypeError(
            f"unconstrained_prior must be a dict site -> (loc, scale), got {type(priors).__name__}"
        )
    for name, pair in priors.items():
        if not isinstance(name, str):
            raise TypeError(f"unconstrained_prior's keys must be site names, got {name!r}")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"unconstrained_prior[{name!r}] must be a pair (loc, scale), got {pair!r:.80}"
            )
        for part, value in zip(("loc", "scale"), pair):
            label = f"unconstrained_prior[{name!r}]'s {part}"
            if isinstance(value, torch.Tensor):
                if value.is_complex() or value.dtype == torch.bool:
                    raise TypeError(f"{label} must be a real tensor, got dtype {value.dtype}")
                values = value.detach().double()
            elif isinstance(value, numbers.Real) and not isinstance(value, bool):
                values = torch.tensor(float(value), dtype=torch.float64)
            else:
                raise TypeError(
                    f"{label} must be a number or a real tensor, got {type(value).__name__}"
                )
            if not bool(torch.isfinite(values).all()):
                raise ValueError(f"{label} must be finite, got {value!r:.80}")
            if part == "scale" and not bool((values > 0).all()):
                raise ValueError(f"{label} must be > 0, got {value!r:.80}")


def _check_generator(generator):
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be None or a torch.Generator, got {type(generator).__name__}"
        )


def LoFi(model: Callable, rank: int = 10, **kwargs) -> BONG:
    """
    LoFi (Chang et al. 2023): BONG-LIN with a diagonal-plus-rank-``rank`` precision,
    ``O(D rank^2)`` per update. Other keyword arguments go to :class:`BONG`.
    """
    return BONG(model, family="dlr", rank=rank, **kwargs)


def WoLF(model: Callable, c: float, squared: bool = True, **kwargs) -> BONG:
    r"""
    WoLF (Duran-Martin et al. 2024): a filter whose log-likelihood is weighted by the
    squared inverse multi-quadric of the residual against the predicted mean, :math:`W^2
    = c^2 / (c^2 + \lVert y - \hat y\rVert^2)` (:class:`IMQ`), with soft threshold ``c``;
    full covariance unless ``family`` says otherwise. ``squared=False`` weighs by
    :math:`W` instead (not the paper's; see :class:`IMQ`). Other keyword arguments go to
    :class:`BONG`.
    """
    return BONG(model, robust=IMQ(c, squared=squared), **kwargs)
