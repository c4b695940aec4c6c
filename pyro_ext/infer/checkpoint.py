"""
What binds a checkpoint of :class:`pyro_ext.infer.MCMC` to its run, and what makes a
damaged or edited one fail with an error that names the entry at fault.

A checkpoint is a nested dict of tensors, numbers, strings and Pyro's streaming statistics.
Three things guard it:

- :func:`sign` / :func:`verify`: a SHA-256 digest of every leaf (each tensor with its dtype
  and shape, each number or string with its type), keyed by the leaf's path
  (``checkpoint['kernel']['state']['z']``). A changed, missing or added leaf is named.
  The digests catch damage and casual edits, not an attacker, who can recompute them.
- :func:`run_fingerprint` and :func:`data_digest`: what the run was (the kernel, its
  hyper-parameters, the model's sample sites, the model arguments), compared item by item
  by :func:`differences` when resuming.
- :func:`check_like`: the structure of a saved state against the state a freshly set-up
  kernel has (same keys, tensors of the same shape and dtype), so that an edited state
  that still carries valid digests is refused before the kernel reads it.
"""

import hashlib
import inspect
import re
import types

import numpy as np
import pyro
import torch
from pyro.poutine.util import site_is_subsample

from ..ops.random import rng_preserved

__all__ = [
    "FORMAT",
    "check_like",
    "checksums",
    "data_differences",
    "data_digest",
    "describe",
    "differences",
    "kernel_config",
    "model_sites",
    "render",
    "run_fingerprint",
    "sign",
    "verify",
]

#: The version of the checkpoint layout; a file of another one is refused.
FORMAT = 2

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


# -- paths and digests ---------------------------------------------------------------------
def render(path) -> str:
    """``("kernel", "state", "z")`` -> ``"checkpoint['kernel']['state']['z']"``; an object's
    attribute (inside the streaming statistics) is written ``.name``."""
    parts = []
    for key in path:
        parts.append(f".{key.name}" if isinstance(key, _Attribute) else f"[{key!r}]")
    return "checkpoint" + "".join(parts)


class _Attribute(str):
    """A path component that is an attribute of an object, not a dict key."""

    @property
    def name(self):
        return str(self)


def _tensor_bytes(tensor):
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _digest(value) -> str:
    """SHA-256 of one leaf: a tensor's dtype, shape and bytes, or another value's type and
    ``repr``."""
    sha = hashlib.sha256()
    if isinstance(value, torch.Tensor):
        sha.update(f"tensor {value.dtype} {list(value.shape)} ".encode())
        sha.update(_tensor_bytes(value))
    else:
        sha.update(f"{type(value).__qualname__} {value!r}".encode())
    return sha.hexdigest()


def _leaves(value, path=()):
    """``(path, leaf)`` of a nested checkpoint, in its stored order; an empty container is
    a leaf of its own, so emptying one changes a digest."""
    if isinstance(value, dict):
        if not value:
            yield path, value
        for key, item in value.items():
            yield from _leaves(item, path + (key,))
    elif isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        if not value:
            yield path, value
        for i, item in enumerate(value):
            yield from _leaves(item, path + (i,))
    elif isinstance(value, torch.Tensor) or value is None:
        yield path, value
    elif isinstance(value, (bool, int, float, complex, str, bytes, torch.Size, torch.dtype)):
        yield path, value
    elif hasattr(value, "__dict__"):
        # Pyro's streaming statistics (the only objects a weights-only load rebuilds).
        yield path, type(value).__qualname__
        for name, item in sorted(vars(value).items()):
            yield from _leaves(item, path + (_Attribute(name),))
    else:
        yield path, value


def checksums(checkpoint: dict) -> dict:
    """``{path: sha256}`` of every leaf of ``checkpoint`` but its ``"checksums"``."""
    return {
        render(path): _digest(leaf)
        for path, leaf in _leaves({k: v for k, v in checkpoint.items() if k != "checksums"})
    }


def sign(checkpoint: dict) -> dict:
    """Store the digests of every leaf as ``checkpoint["checksums"]``; returns ``checkpoint``."""
    checkpoint["checksums"] = checksums(checkpoint)
    return checkpoint


def verify(checkpoint: dict, where: str) -> None:
    """
    Raise a ``ValueError`` that names the first leaf that is missing, added or changed
    since :func:`sign`.

    :param str where: how the error names the file (``"checkpoint_path='run.pt'"``).
    """
    stored = checkpoint["checksums"]
    if not isinstance(stored, dict):
        raise TypeError(
            f"{where}: checkpoint['checksums'] must be a dict of digests, got "
            f"{type(stored).__name__}; the file was modified or damaged: restart the run"
        )
    now = checksums(checkpoint)
    damaged = "the file was modified or damaged: restart the run"
    missing = [path for path in stored if path not in now]
    if missing:
        path = missing[0]
        # A leaf replaced by a container leaves leaves below its path: say "replaced".
        replaced = any(p.startswith(path + "[") or p.startswith(path + ".") for p in now)
        raise ValueError(
            f"{where}: {path} "
            + (
                "was replaced by a container (it does not match its checksum); "
                if replaced
                else "is missing (its checksum is stored, the entry is not); "
            )
            + damaged
        )
    for path, digest in now.items():
        if path not in stored:
            raise ValueError(
                f"{where}: {path} is not part of the saved state (it has no checksum); " + damaged
            )
        if stored[path] != digest:
            raise ValueError(f"{where}: {path} does not match its checksum; " + damaged)


# -- the structure of a saved state ----------------------------------------------------------
def check_like(saved, template, path, where):
    """
    Check ``saved`` against ``template``, the value a freshly set-up kernel has: a tensor
    needs a tensor of the same dtype and shape, a non-empty dict the same keys, a non-empty
    list the same length, an ``int`` / ``float`` / ``bool`` / ``str`` the same kind of value.
    Empty containers and ``None`` (what is filled in during the run, e.g. warm-up
    estimates) accept any value.

    :raises TypeError: a value of the wrong type, naming its path.
    :raises ValueError: a wrong shape or dtype, a missing or an unknown key.
    """
    name = render(path)
    if isinstance(template, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            raise TypeError(
                f"{where}: {name} must be a tensor of shape {list(template.shape)}, got "
                f"{type(saved).__name__}; the file was modified or damaged: restart the run"
            )
        if saved.dtype != template.dtype or saved.shape != template.shape:
            raise ValueError(
                f"{where}: {name} has shape {list(saved.shape)} and dtype {saved.dtype}, this "
                f"run's has shape {list(template.shape)} and dtype {template.dtype}; the file "
                "was modified or damaged, or was written by another run: restart the run"
            )
    elif isinstance(template, dict):
        if not isinstance(saved, dict):
            raise TypeError(
                f"{where}: {name} must be a dict, got {type(saved).__name__}; the file was "
                "modified or damaged: restart the run"
            )
        if not template:
            return
        for key in template:
            if key not in saved:
                raise ValueError(
                    f"{where}: {render(path + (key,))} is missing; the file was modified or "
                    "damaged, or was written by another kernel: restart the run"
                )
        for key in saved:
            if key not in template:
                raise ValueError(
                    f"{where}: {render(path + (key,))} is not part of this kernel's state "
                    f"(its keys are {list(template)}); the file was modified or damaged, or "
                    "was written by another kernel: restart the run"
                )
        for key, value in template.items():
            check_like(saved[key], value, path + (key,), where)
    elif isinstance(template, (list, tuple)):
        if not isinstance(saved, (list, tuple)):
            raise TypeError(
                f"{where}: {name} must be a list, got {type(saved).__name__}; the file was "
                "modified or damaged: restart the run"
            )
        if template and len(saved) != len(template):
            raise ValueError(
                f"{where}: {name} has {len(saved)} entries, this run's has {len(template)}; the "
                "file was modified or damaged: restart the run"
            )
        for i, value in enumerate(template):
            check_like(saved[i], value, path + (i,), where)
    elif template is not None:
        if isinstance(template, bool):
            ok = isinstance(saved, bool)
        elif isinstance(template, int):
            ok = isinstance(saved, int) and not isinstance(saved, bool)
        elif isinstance(template, float):
            ok = isinstance(saved, (int, float)) and not isinstance(saved, bool)
        else:
            ok = isinstance(saved, type(template))
        if not ok:
            raise TypeError(
                f"{where}: {name} must be of type {type(template).__name__}, got "
                f"{type(saved).__name__}; the file was modified or damaged: restart the run"
            )


# -- what the run was --------------------------------------------------------------------
def describe(value, depth=0):
    """
    A plain, comparable description of a configuration value (weights-only loadable and
    independent of memory addresses): numbers and strings as they are, containers
    element-wise, a function by its qualified name, a tensor by its shape, dtype and
    digest, and an object (a step-size schedule, a Stein kernel) as its class name with
    its public attributes.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={list(value.shape)}, dtype={value.dtype}, sha256={_digest(value)})"
    if isinstance(value, (list, tuple)):
        return [describe(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {str(key): describe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    if depth < 3 and hasattr(value, "__dict__"):
        attributes = ", ".join(
            f"{key}={describe(item, depth + 1)!r}"
            for key, item in sorted(vars(value).items())
            if not key.startswith("_")
        )
        return f"{type(value).__name__}({attributes})"
    return _ADDRESS.sub("", repr(value))


def _distribution_name(fn):
    name = type(fn).__name__
    base = getattr(fn, "base_dist", None)
    if isinstance(base, torch.distributions.Distribution):
        name += f"({_distribution_name(base)})"
    return name


def model_sites(model, args, kwargs) -> dict:
    """
    ``{"model site 'name'": {distribution, support, batch_shape, event_shape, observed}}``
    of every sample site (latent and observed; not the plates' subsample sites) of one run
    of ``model``. The run is hidden from other handlers and leaves the random state as it
    found it, so a run with checkpoints makes the draws of one without.
    """
    with rng_preserved(), torch.no_grad(), pyro.poutine.block():
        trace = pyro.poutine.trace(model).get_trace(*args, **kwargs)
    sites = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        fn = site["fn"]
        sites[f"model site {name!r}"] = {
            "distribution": _distribution_name(fn),
            "support": _ADDRESS.sub("", repr(getattr(fn, "support", None))),
            "batch_shape": list(getattr(fn, "batch_shape", ())),
            "event_shape": list(getattr(fn, "event_shape", ())),
            "observed": bool(site["is_observed"]),
        }
    return sites


def kernel_config(kernel) -> dict:
    """
    The kernel's class and the settings that shape its chain: for a compound kernel
    (:class:`~pyro_ext.infer.Gibbs`) its discrete sites, moves and sweep interval and its
    inner kernel's class; then the (inner) kernel's ``step_size`` schedule, ``repulsion``,
    ``temperature``, ``adapt_after_warmup``, ``adapt_window`` and ``adam_floor`` where it
    has them, the default step's ``bias_tolerance`` and ``bias_bound`` (with
    ``step_size=None``), and every entry of its ``hyper`` (``friction``, ``betas``, ``eps``).
    """
    config = {}
    source = kernel
    inner = getattr(kernel, "kernel", None)
    if inner is not None and hasattr(inner, "hyper"):
        config["discrete_sites"] = describe(getattr(kernel, "discrete_sites", None))
        config["moves"] = describe(getattr(kernel, "moves", None))
        config["every"] = describe(getattr(kernel, "every", None))
        config["inner kernel"] = type(inner).__name__
        source = inner
    for name in (
        "step_size",
        "repulsion",
        "temperature",
        "adapt_after_warmup",
        "adapt_window",
        "adam_floor",
    ):
        if hasattr(source, name):
            config[name] = describe(getattr(source, name))
    if hasattr(source, "bias_bound") and getattr(source, "step_size", None) is None:
        # The default step's rule: a checkpoint taken during warm-up continues it.
        config["bias_tolerance"] = describe(source.bias_tolerance)
        config["bias_bound"] = describe(source.bias_bound)
    for name, value in dict(getattr(source, "hyper", {})).items():
        config[name] = describe(value)
    return config


def run_fingerprint(kernel, model, args, kwargs) -> dict:
    """What a checkpoint must match to resume (see :meth:`pyro_ext.infer.MCMC.resume`):
    the kernel, its particles, its settings, its shard layout, the model's sample sites
    and the shapes of the model's tensor arguments."""
    leaves = torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs)))
    shard = kernel.shard
    return {
        "kernel": type(kernel).__name__,
        "num_particles": kernel.num_particles,
        "sites": [[name, list(shape)] for name, shape in kernel.site_shapes()],
        "data shapes": [list(x.shape) for x in leaves if isinstance(x, torch.Tensor)],
        "shard": None if shard is None else [shard.mode, shard.rank, shard.world_size],
        **kernel_config(kernel),
        **model_sites(model, args, kwargs),
    }


def _argument_names(model, args, kwargs):
    """``[(name, value)]`` of the model's arguments, named after its signature where it
    binds (``"x"``), else by position (``"args[0]"``, ``"kwargs['x']"``)."""
    try:
        bound = inspect.signature(model).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [(f"args[{i}]", value) for i, value in enumerate(args)] + [
            (f"kwargs[{key!r}]", value) for key, value in sorted(kwargs.items())
        ]
    return list(bound.arguments.items())


def _describe_data(value, name, out):
    if isinstance(value, torch.Tensor):
        out[name] = {
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "sha256": hashlib.sha256(_tensor_bytes(value)).hexdigest(),
        }
    elif isinstance(value, np.ndarray):
        out[name] = {
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest(),
        }
    elif isinstance(value, dict):
        for key, item in value.items():
            _describe_data(item, f"{name}[{key!r}]", out)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _describe_data(item, f"{name}[{i}]", out)
    elif isinstance(value, torch.nn.Module):
        for key, item in value.state_dict().items():
            _describe_data(item, f"{name}.{key}", out)
    else:
        out[name] = {"value": _ADDRESS.sub("", repr(value))}


def data_digest(model, args, kwargs) -> dict:
    """
    ``{argument: description}`` of the model's arguments: a tensor (or array) by its
    shape, dtype and the SHA-256 of its bytes, anything else by its ``repr``; nested
    containers entry by entry (``"batch['x']"``).
    """
    out = {}
    for name, value in _argument_names(model, args, kwargs):
        _describe_data(value, name, out)
    return out


def _equal(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    try:  # an array compares elementwise: ambiguous as a bool, so not equal here
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


def differences(saved, now, absent="absent") -> list:
    """``["item was A, is B"]`` of the items of two fingerprints (``saved``: the
    checkpoint's, ``now``: this run's); a dict item is compared field by field."""
    out = []
    for key in list(now) + [key for key in saved if key not in now]:
        if key not in saved:
            out.append(f"{key} was {absent}, is {now[key]!r}")
        elif key not in now:
            out.append(f"{key} was {saved[key]!r}, is {absent}")
        elif isinstance(saved[key], dict) and isinstance(now[key], dict):
            for field in list(now[key]) + [f for f in saved[key] if f not in now[key]]:
                a, b = saved[key].get(field, absent), now[key].get(field, absent)
                if not _equal(a, b):
                    out.append(f"{key} {field} was {a!r}, is {b!r}")
        elif not _equal(saved[key], now[key]):
            out.append(f"{key} was {saved[key]!r}, is {now[key]!r}")
    return out


def data_differences(saved, now) -> list:
    """What differs between two :func:`data_digest` s, argument by argument."""
    out = []
    for name in list(now) + [name for name in saved if name not in now]:
        a, b = saved.get(name), now.get(name)
        if a is None:
            out.append(f"model argument {name!r} was absent, is given")
        elif b is None:
            out.append(f"model argument {name!r} was given, is absent")
        elif not isinstance(a, dict):
            out.append(f"model argument {name!r} was {a!r}, is {b!r}")
        elif "sha256" in b and "sha256" in a:
            if a.get("shape") != b["shape"] or a.get("dtype") != b["dtype"]:
                out.append(
                    f"model argument {name!r} was of shape {a.get('shape')} and dtype "
                    f"{a.get('dtype')}, is of shape {b['shape']} and dtype {b['dtype']}"
                )
            elif a["sha256"] != b["sha256"]:
                out.append(
                    f"model argument {name!r} holds other values than when the checkpoint "
                    f"was written (same shape {b['shape']} and dtype {b['dtype']}, sha256 "
                    f"{str(a['sha256'])[:12]}... then, {b['sha256'][:12]}... now)"
                )
        elif not _equal(a, b):
            was = a.get("value", a) if "value" in a else a
            out.append(f"model argument {name!r} was {was!r}, is {b.get('value', b)!r}")
    return out
