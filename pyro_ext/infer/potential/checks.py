"""The data contract of the potential: a model's observed data hold no NaN or infinite values
(NaN where the site's support admits it, a missing value, is fine), checked at set-up and on
new data, with an error that names the observed site, the model argument and the first bad
index (:func:`check_model_data`).
"""

import inspect

import pyro
import torch
from pyro.poutine.util import site_is_subsample


def _first_bad_index(bad: torch.Tensor) -> tuple:
    return tuple(int(i) for i in bad.nonzero()[0])


def _nonfinite_arguments(model, args, kwargs) -> list[str]:
    """``"argument 'y' has NaN first at index (17,)"`` for each floating-point tensor
    among the model's arguments that holds NaN or infinite values."""
    try:
        bound = inspect.signature(model).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):  # no signature, or one that *args hides
        bound = {f"#{i}": a for i, a in enumerate(args)} | dict(kwargs)
    found = []
    for name, value in bound.items():
        leaves, spec = torch.utils._pytree.tree_flatten(value)
        for position, leaf in enumerate(leaves):
            if not (isinstance(leaf, torch.Tensor) and leaf.is_floating_point()):
                continue
            bad = ~torch.isfinite(leaf)
            if bool(bad.any()):
                kind = "NaN" if bool(leaf[bad].isnan().any()) else "infinite values"
                label = name if len(leaves) == 1 else f"{name}[{position}]"
                label = f"positional argument {label[1:]}" if label.startswith("#") else label
                found.append(f"{label!r} has {kind} first at index {_first_bad_index(bad)}")
    return found


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


def check_model_data(model, args, kwargs, trace) -> None:
    """
    Raise a :class:`ValueError` naming the observed site, the model argument and the first
    bad index when the model's observed data hold NaN or infinite values (NaN where the
    site's support admits it, a missing value, is fine).

    ``trace`` is a trace of the model already run (its observed sites are checked as they
    are). When a floating-point argument holds non-finite values, the model is run again
    on ``args``/``kwargs`` over the whole data (in passes of each subsampled plate's
    minibatch size; the latent sites keep the trace's values), so that a bad row is found now,
    not at the first minibatch that draws it, nor never, when no minibatch does.
    """
    arguments = _nonfinite_arguments(model, args, kwargs)
    plates = {
        name: (site["fn"].size, site["fn"].subsample_size, site["value"])
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and site_is_subsample(site)
        and (site["fn"].subsample_size or site["fn"].size) < site["fn"].size
    }
    _check_observed_sites(trace, arguments, "a minibatch" if plates else None)
    if not arguments:
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
        _check_observed_sites(tracer.trace, arguments, minibatch or None)
        for name, site in tracer.trace.nodes.items():
            if site["type"] == "sample" and site["is_observed"] and not site_is_subsample(site):
                log_prob = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
                if bool(log_prob.isnan().any()):
                    raise ValueError(
                        f"the log density of observed site {name!r} is NaN"
                        f"{' in ' + minibatch if minibatch else ''} because the model's "
                        f"argument {'; '.join(arguments)}. Drop or impute the non-finite "
                        "entries before inference."
                    )
