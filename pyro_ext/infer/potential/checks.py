"""The data contract of the potential, checked at set-up and on new data, with errors that
name the observed site, the model argument that carries it and the first bad index:

* the observed values hold no NaN or infinite values (NaN where the site's support admits
  it, a missing value, is fine);
* they lie in the support of their distribution (Bernoulli labels 0/1, Poisson counts,
  Categorical labels below the number of categories...), over the whole data set, not only
  the set-up minibatch;
* they have a floating dtype where the distribution needs one (``TypeError``);
* their shape is the distribution's, with no silent broadcasting (a scalar-parameter
  distribution observing a vector, the common Pyro idiom, is fine);
* no observed site or plate is empty, and no plate subsamples more rows than it has.

:func:`check_model_data` checks a trace of the model; :func:`run_model_checked` runs the
model for that trace, turning the errors that bad data raise inside the model (a plate of
size 0, a wrong-length argument) into errors that say which argument is wrong.
"""

import inspect
import re

import pyro
import torch
from pyro.distributions import constraints
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from pyro.poutine.util import site_is_subsample

from ...ops.random import rng_preserved


def _first_bad_index(bad: torch.Tensor) -> tuple:
    return tuple(int(i) for i in bad.nonzero()[0])


def _tensor_arguments(model, args, kwargs) -> list[tuple[str, torch.Tensor]]:
    """``(label, tensor)`` for each tensor among the model's arguments, bound by name:
    ``'y'``, ``'data[1]'`` (a leaf of a container argument), ``'positional argument 0'``
    (a model whose signature ``*args`` hides)."""
    try:
        bound = inspect.signature(model).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):  # no signature, or one that *args hides
        bound = {f"#{i}": a for i, a in enumerate(args)} | dict(kwargs)
    found = []
    for name, value in bound.items():
        leaves = torch.utils._pytree.tree_leaves(value)
        for position, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                label = name if len(leaves) == 1 else f"{name}[{position}]"
                label = f"positional argument {label[1:]}" if label.startswith("#") else label
                found.append((label, leaf))
    return found


def _nonfinite_arguments(model, args, kwargs) -> list[str]:
    """``"argument 'y' has NaN first at index (17,)"`` for each floating-point tensor
    among the model's arguments that holds NaN or infinite values."""
    found = []
    for label, leaf in _tensor_arguments(model, args, kwargs):
        if not leaf.is_floating_point():
            continue
        bad = ~torch.isfinite(leaf)
        if bool(bad.any()):
            kind = "NaN" if bool(leaf[bad].isnan().any()) else "infinite values"
            found.append(f"{label!r} has {kind} first at index {_first_bad_index(bad)}")
    return found


def _argument_shapes(arguments) -> str:
    """``"'x' of shape (5, 3), 'y' of shape (4,)"``: what a shape error shows."""
    if not arguments:
        return "no tensor arguments"
    return ", ".join(f"{label!r} of shape {tuple(t.shape)}" for label, t in arguments)


def _argument_of(value, arguments, plate_sizes=()) -> str | None:
    """The label of the model argument that carries the observed ``value``: the very tensor,
    a view of it, else the one argument of its shape (or of its shape with the leading
    dimension a subsampled plate's full size, for a minibatch ``y[i]``). ``None`` if unknown."""
    if not isinstance(value, torch.Tensor):
        return None
    for label, tensor in arguments:
        if tensor is value:
            return label
    if value.numel():
        pointer = value.untyped_storage().data_ptr()
        for label, tensor in arguments:
            if tensor.numel() and tensor.untyped_storage().data_ptr() == pointer:
                return label
    same = [label for label, tensor in arguments if tensor.shape == value.shape]
    if len(same) == 1:
        return same[0]
    rows = [
        label
        for label, tensor in arguments
        if value.dim()
        and tensor.dim() == value.dim()
        and tensor.shape[1:] == value.shape[1:]
        and tensor.shape[0] in plate_sizes
    ]
    return rows[0] if len(rows) == 1 else None


def _carried_by(label) -> str:
    return f" (the model's argument {label!r})" if label else ""


def _check_observed_sites(trace, arguments, minibatch=None):
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
            continue
        value = site["value"]
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            continue
        bad = ~torch.isfinite(value)
        if not bool(bad.any()):
            continue
        # A NaN the site's support admits is a missing value (the pyro_ext.timeseries
        # models marginalise them); an infinite value never is.
        nan_allowed = bool(site["fn"].support.check(torch.full_like(value, float("nan"))).all())
        if nan_allowed:
            bad = bad & ~value.isnan()
            if not bool(bad.any()):
                continue
        kind = "NaN" if bool(value[bad].isnan().any()) else "infinite"
        where = f"first at index {_first_bad_index(bad)} of its {tuple(value.shape)} values"
        if minibatch is not None:
            where = f"in {minibatch}"
        source = f" (the model's argument {'; '.join(arguments)})" if arguments else ""
        raise ValueError(
            f"observed site {name!r} holds {kind} values, {where}{source}; the "
            "likelihood of those rows is not finite, so inference would diverge or return "
            "NaN. Drop or impute them before inference (models that marginalise missing "
            "values, such as those in pyro_ext.timeseries, take NaN where the observation "
            "is missing)."
        )


def _observed_sites(trace):
    """The observed sample sites of ``trace`` that hold data: not plates' subsample sites,
    not ``pyro.deterministic`` values (recorded as observed Deltas), not the placeholders
    that the online filters put in for outputs without a value (``infer["_placeholder"]``),
    not ``pyro.factor`` terms (a :class:`~pyro.distributions.Unit` observing an empty value)."""
    for name, site in trace.nodes.items():
        if (
            site["type"] == "sample"
            and site["is_observed"]
            and not site_is_subsample(site)
            and not site["infer"].get("_deterministic")
            and not site["infer"].get("_placeholder")
            and not isinstance(_base_distribution(site["fn"]), pyro.distributions.Unit)
        ):
            yield name, site


def _subsampled_plate_sizes(trace) -> set[int]:
    return {
        site["fn"].size
        for site in trace.nodes.values()
        if site["type"] == "sample" and site_is_subsample(site)
    }


def _check_shapes(trace, arguments) -> None:
    """Each observed site's value is not empty and has exactly its distribution's shape
    (batch + event), with no broadcasting either way (``y[:1]`` in a plate of ``N``, or
    ``y[:, None]`` against ``N`` distributions: an outer product). Two idioms stay allowed:
    a distribution with a single batch element (``Normal(mu, 1.0)`` with ``mu`` scalar,
    observing a vector without a plate) may observe any number of them, and a value with
    no batch dimension at all (one event) may be observed by every element of a plate."""
    plate_sizes = _subsampled_plate_sizes(trace)
    for name, site in _observed_sites(trace):
        value, fn = site["value"], site["fn"]
        if not isinstance(value, torch.Tensor):
            continue
        label = _argument_of(value, arguments, plate_sizes)
        expected = tuple(fn.batch_shape + fn.event_shape)
        if value.numel() == 0:
            raise ValueError(
                f"observed site {name!r}{_carried_by(label)} is empty (shape "
                f"{tuple(value.shape)}): the data are empty, so there is nothing to infer "
                f"from. Pass at least one observation (the model's arguments: "
                f"{_argument_shapes(arguments)})."
            )
        try:
            common = tuple(torch.broadcast_shapes(value.shape, expected))
        except RuntimeError:
            common = None
        single = fn.batch_shape.numel() <= 1
        if common == tuple(value.shape) and (single or common == expected):
            continue
        if common == expected and value.dim() <= len(fn.event_shape):
            # One event observed by every element of a plate (no batch dimension at all):
            # deliberate repetition, which the tests of the vectorised paths use.
            continue
        if common is None:
            how = "they do not even broadcast"
        elif common != tuple(value.shape):
            how = f"the observations would be broadcast to {common}, each counted several times"
        else:
            how = (
                f"the distribution would be broadcast to {common}, an outer product of "
                "every observation with every distribution element"
            )
        raise ValueError(
            f"observed site {name!r}{_carried_by(label)} has shape {tuple(value.shape)}, but "
            f"its {type(fn).__name__} distribution has shape {expected} (batch "
            f"{tuple(fn.batch_shape)}, event {tuple(fn.event_shape)}): {how}. Pass one "
            "observation per distribution element, of the same shape (e.g. as many rows in "
            "y as in x; the model's arguments: "
            f"{_argument_shapes(arguments)})."
        )


def _unmasked(site, shape):
    """Where the site's log density counts (``poutine.mask``, ``.mask()``), as a bool tensor
    broadcastable to ``shape``; ``None`` when everywhere."""
    masks = [site["mask"]]
    fn = site["fn"]
    while isinstance(fn, (torch.distributions.Independent, pyro.distributions.MaskedDistribution)):
        if isinstance(fn, pyro.distributions.MaskedDistribution):
            masks.append(fn._mask)
        fn = fn.base_dist
    unmasked = None
    for mask in masks:
        if mask is None or mask is True:
            continue
        if mask is False:
            return torch.zeros(shape, dtype=torch.bool, device=site["value"].device)
        try:
            torch.broadcast_shapes(mask.shape, shape)
        except RuntimeError:
            continue
        unmasked = mask if unmasked is None else unmasked & mask
    return unmasked


def _check_support(trace, arguments, minibatch=None) -> None:
    """Each observed value lies in its distribution's support, where the log density counts
    (masked entries are free); NaN entries are the NaN check's (a missing value or an
    error)."""
    plate_sizes = _subsampled_plate_sizes(trace)
    for name, site in _observed_sites(trace):
        value, fn = site["value"], site["fn"]
        if not isinstance(value, torch.Tensor):
            continue
        support = fn.support
        while isinstance(support, constraints.independent):
            support = support.base_constraint
        try:
            inside = support.check(value)
        except (NotImplementedError, ValueError, RuntimeError, TypeError):
            continue  # a dependent support, or one that cannot say
        if not isinstance(inside, torch.Tensor):
            continue
        missing = (
            value.isnan()
            if value.is_floating_point()
            else torch.zeros_like(value, dtype=torch.bool)
        )
        for _ in range(support.event_dim):
            missing = missing.any(-1)
        bad = ~inside & ~missing
        unmasked = _unmasked(site, bad.shape)
        if unmasked is not None:
            bad = bad & unmasked
        if not bool(bad.any()):
            continue
        index = _first_bad_index(bad)
        batch = value.shape[: value.dim() - support.event_dim]
        shown = value.expand(*bad.shape, *value.shape[len(batch) :])[index] if index else value
        shown = shown.tolist() if shown.numel() <= 8 else f"a {tuple(shown.shape)} block"
        where = f"first at index {index} of its {tuple(value.shape)} values"
        if minibatch:
            where = f"first at index {index} of {minibatch}"
        label = _argument_of(value, arguments, plate_sizes)
        raise ValueError(
            f"observed site {name!r}{_carried_by(label)} holds a value outside the support "
            f"{support} of its {type(_base_distribution(fn)).__name__} distribution, {where}: "
            f"{shown}. Its log density there is undefined, so inference would be silently "
            "wrong; pass data the distribution can take (e.g. Bernoulli labels 0 or 1, "
            "Poisson counts 0, 1, 2..., Categorical labels 0..K-1, Beta values in [0, 1])."
        )


def _base_distribution(fn):
    while isinstance(fn, (torch.distributions.Independent, pyro.distributions.MaskedDistribution)):
        fn = fn.base_dist
    return fn


def _check_dtypes(trace, arguments) -> None:
    """An integer or bool observed value whose distribution computes its log density in
    floating point only (Bernoulli, Poisson): torch fails with "result type Float can't be
    cast to the desired output type Long" at the first step. The distribution is asked:
    the value is refused if its log density fails where the floating value's does not."""
    plate_sizes = _subsampled_plate_sizes(trace)
    for name, site in _observed_sites(trace):
        value, fn = site["value"], site["fn"]
        if not isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        with torch.no_grad(), pyro.validation_enabled(False):
            try:
                fn.log_prob(value)
                continue
            except (RuntimeError, TypeError, ValueError):  # see whether a float works
                pass
            dtype = torch.get_default_dtype()
            try:
                fn.log_prob(value.to(dtype))
            except (RuntimeError, TypeError, ValueError):  # not a dtype problem: others' checks
                continue
        label = _argument_of(value, arguments, plate_sizes)
        argument = label or "y"
        raise TypeError(
            f"observed site {name!r}{_carried_by(label)} holds {value.dtype} values, but its "
            f"{type(_base_distribution(fn)).__name__} distribution needs a floating tensor "
            f"(its log density cannot be computed on integers); pass {argument}.float() or "
            f"{argument}.to(torch.get_default_dtype())."
        )


def check_model_data(model, args, kwargs, trace=None, nonfinite=True) -> None:
    """
    Check the model's observed data against the contract of the module docstring: raise a
    :class:`ValueError` (a wrong value: non-finite, outside the support, a wrong shape,
    empty) or a :class:`TypeError` (an integer value where the distribution needs floats)
    that names the observed site, the model argument that carries it and the first bad
    index.

    ``trace`` is a trace of the model already run on ``args``/``kwargs`` (its observed
    sites' shapes and dtypes are checked as they are); ``None`` runs the model
    (:func:`run_model_checked`, leaving torch's random state as it was): what a caller
    passes for new data of the same shapes, whose old trace holds the old values. When a plate subsamples, or a floating-point argument
    holds non-finite values, the model is run again over the whole data (in passes of each
    subsampled plate's minibatch size; the latent sites keep the trace's values), so that
    a bad row is found now, not at the first minibatch that draws it, nor never, when no
    minibatch does. This is one forward pass over the data, without gradients, per data
    set: callers check once at set-up and when the data change, never per step.

    :param bool nonfinite: also refuse NaN and infinite values (NaN where the support admits
        it is fine); ``False`` for a caller that takes NaN for a missing observation itself
        (the online filters), which keeps every other check.
    """
    if trace is None:
        # A check draws nothing the caller would: its latent draws are thrown away.
        with rng_preserved():
            trace = run_model_checked(model, args, kwargs, nonfinite=nonfinite)
    tensors = _tensor_arguments(model, args, kwargs)
    arguments = _nonfinite_arguments(model, args, kwargs) if nonfinite else []
    plates = {
        name: (site["fn"].size, site["fn"].subsample_size, site["value"])
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and site_is_subsample(site)
        and (site["fn"].subsample_size or site["fn"].size) < site["fn"].size
    }
    _check_shapes(trace, tensors)
    if nonfinite:
        _check_observed_sites(trace, arguments, "a minibatch" if plates else None)
    _check_dtypes(trace, tensors)
    if not arguments and not plates:
        _check_support(trace, tensors)
        return
    # Here, not at the top: density.py, which defines the messenger, imports this module.
    from .density import LogJointMessenger

    # Plates fix their subsample size, so the whole data is covered in minibatches of
    # that size: pass k takes rows [k b, (k + 1) b) (mod N) of every subsampled plate.
    latents = {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }
    passes = max((-(-size // batch) for size, batch, _ in plates.values()), default=1)
    for k in range(passes):
        rows = {
            name: torch.arange(k * batch, (k + 1) * batch, device=like.device) % size
            for name, (size, batch, like) in plates.items()
        }
        with (
            torch.no_grad(),
            pyro.validation_enabled(False),
            pyro.poutine.block(),
            pyro.poutine.trace() as tracer,
            LogJointMessenger(latents, rows, strict=False, block=False),
        ):
            model(*args, **kwargs)
        minibatch = ", ".join(
            f"rows {k * batch % size}-{((k + 1) * batch - 1) % size} of plate {name!r}"
            for name, (size, batch, _) in plates.items()
        )
        if nonfinite:
            _check_observed_sites(tracer.trace, arguments, minibatch or None)
        _check_support(tracer.trace, tensors, minibatch or None)
        if not arguments:
            continue
        for name, site in _observed_sites(tracer.trace):
            log_prob = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
            if bool(log_prob.isnan().any()):
                raise ValueError(
                    f"the log density of observed site {name!r} is NaN"
                    f"{' in ' + minibatch if minibatch else ''} because the model's "
                    f"argument {'; '.join(arguments)}. Drop or impute the non-finite "
                    "entries before inference."
                )


class _DataError(ValueError):
    """An error about the data found inside the model's run (Pyro's trace appends its
    shapes table to errors raised there; :func:`run_model_checked` takes it off)."""


class _PlateCheck(Messenger):
    """Refuses, as each plate opens, one of size 0 (Pyro's ``ZeroDivisionError``) or one
    that subsamples more rows than it has (Pyro's "different subsample_size in the model
    and guide?")."""

    def __init__(self, arguments):
        super().__init__()
        self.arguments = arguments

    def _process_message(self, msg):
        if msg["type"] != "sample" or not isinstance(msg["fn"], _Subsample):
            return
        name, size, batch = msg["name"], msg["fn"].size, msg["fn"].subsample_size
        if size == 0:
            raise _DataError(
                f"plate {name!r} has size 0: the data are empty, so there is nothing to infer "
                "from. Pass at least one observation (the model's arguments: "
                f"{_argument_shapes(self.arguments)})."
            )
        if batch is not None and batch <= 0:
            raise _DataError(
                f"plate {name!r} has subsample_size={batch}: a minibatch needs at least one "
                f"row. Pass 1 <= subsample_size <= {size}, or leave it out to use every row."
            )
        if batch is not None and size is not None and batch > size:
            raise _DataError(
                f"plate {name!r} subsamples subsample_size={batch} of its size {size}: a "
                f"minibatch cannot hold more rows than the data. Pass subsample_size <= {size}"
                " (or leave it out to use every row; the model's arguments: "
                f"{_argument_shapes(self.arguments)})."
            )


# Torch's and Pyro's words for tensors whose shapes disagree, raised inside a model run.
_SHAPE_ERROR = re.compile(
    r"must match the size|shapes cannot be multiplied|Shape mismatch|size mismatch|"
    r"out of bounds|cannot be broadcast|not broadcastable|expanded size|"
    r"Incompatible shapes|shape .* is invalid for input"
)


def run_model_checked(model, args, kwargs, *, nonfinite=True):
    """
    Trace one plain run of ``model`` on ``args``/``kwargs`` (hidden from outer handlers),
    and return the trace; an error that bad data raise inside the run is raised as a
    :class:`ValueError` that names the model's arguments: a plate of size 0 or one that
    subsamples more rows than it has (named), a shape mismatch between arguments (e.g. x
    of 5 rows and y of 4: torch's "size of tensor a (5) must match ..."), with every
    argument's shape, and (``nonfinite``) a Pyro argument check that meets non-finite data,
    with the argument and index of the first one.
    """
    kwargs = {} if kwargs is None else kwargs
    tensors = _tensor_arguments(model, args, kwargs)
    try:
        with pyro.poutine.block(), _PlateCheck(tensors):
            return pyro.poutine.trace(model).get_trace(*args, **kwargs)
    except _DataError as error:
        raise ValueError(str(error).split("\nTrace Shapes:")[0]) from None
    except (RuntimeError, ValueError, IndexError) as error:
        if isinstance(error, NotImplementedError):
            raise
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        arguments = _nonfinite_arguments(model, args, kwargs) if nonfinite else []
        if arguments and isinstance(error, ValueError):
            # Pyro's argument validation meets the non-finite data first: say which.
            raise ValueError(
                f"the model failed on its data ({first_line}): the model's argument "
                f"{'; '.join(arguments)}. Drop or impute the non-finite entries before "
                "inference."
            ) from error
        if _SHAPE_ERROR.search(str(error)):
            raise ValueError(
                f"the model failed on its data ({first_line}): the model's arguments have "
                f"{_argument_shapes(tensors)}, which do not agree. Pass arguments of matching "
                "lengths (e.g. as many observations y as rows of x)."
            ) from error
        raise
