"""
Argument checks for the whole package, and when to check tensor *values*.

The checkers raise :class:`TypeError` for an argument of the wrong type and
:class:`ValueError` for one of the right type but a wrong value, with a message naming the
argument and what was expected; each returns the normalised value (a Python ``int``,
``float`` or ``str``). :func:`values_checked` is the one switch for tensor value checks.
"""

import math
import numbers
import reprlib

import torch
from pyro.distributions.util import is_validation_enabled as pyro_validation_enabled

__all__ = [
    "broadcast_shapes",
    "check_choice",
    "check_int",
    "check_positive",
    "as_real_tensor",
    "check_real",
    "check_real_tensor",
    "check_same_device",
    "same_device",
    "values_checked",
]


def broadcast_shapes(*shapes) -> torch.Size:
    """
    ``torch.broadcast_shapes`` for concrete shapes, without its cost: torch's is written in
    Python over its reference implementation (tens of microseconds a call), which the
    per-call set-up of the sequence functions pays several times. Shapes holding symbolic
    sizes (a trace with dynamic shapes) go to torch's. Raises ``RuntimeError``, as torch's
    does, when the shapes do not broadcast.
    """
    dims = []
    for shape in shapes:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(type(d) is not int for d in shape):
            return torch.broadcast_shapes(*shapes)
        dims.append(shape)
    out = [1] * max((len(d) for d in dims), default=0)
    for shape in dims:
        offset = len(out) - len(shape)
        for i, d in enumerate(shape, offset):
            if d == 1 or d == out[i]:
                continue
            if out[i] != 1:
                raise RuntimeError(
                    f"Shape mismatch: objects cannot be broadcast to a single shape: "
                    f"{', '.join(str(tuple(d)) for d in dims)}"
                )
            out[i] = d
    return torch.Size(out)


def _got(value):
    """``value``'s short repr and its type, for a type error's message."""
    return f"{reprlib.repr(value)} ({type(value).__name__})"


def _interval(low, high, low_open, high_open):
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def check_int(value, name, low=None, high=None, allow_none=False):
    """
    An integer in ``[low, high]``, as an ``int``: any :class:`numbers.Integral` (a NumPy
    integer too) or a 0-dim integer tensor, but not a ``bool``. ``None`` passes through with
    ``allow_none``.

    :raises TypeError: if ``value`` is not an integer.
    :raises ValueError: if it lies outside ``[low, high]``.
    """
    if value is None and allow_none:
        return None
    expected = (
        "an integer" + _interval(low, high, False, False) + (" or None" if allow_none else "")
    )
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    elif (
        isinstance(value, torch.Tensor)
        and value.dim() == 0
        and not (value.dtype.is_floating_point or value.dtype.is_complex)
        and value.dtype != torch.bool
    ):
        number = int(value)
    else:
        raise TypeError(f"{name} must be {expected}, got {_got(value)}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{name} must be {expected}, got {reprlib.repr(number)}")
    return number


def check_real(
    value,
    name,
    low=None,
    high=None,
    low_open=False,
    high_open=False,
    finite=True,
    allow_none=False,
):
    """
    A real number (``bool`` rejected) in the interval from ``low`` to ``high``, each end
    closed unless ``low_open`` / ``high_open``, as a ``float``. NaN is always rejected, and
    infinities too with ``finite=True``; ``None`` passes through with ``allow_none``.

    :raises TypeError: if ``value`` is not a real number.
    :raises ValueError: if it is NaN, infinite (with ``finite``) or outside the interval.
    """
    if value is None and allow_none:
        return None
    expected = (
        ("a finite number" if finite else "a number")
        + _interval(low, high, low_open, high_open)
        + (" or None" if allow_none else "")
    )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {_got(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        number = math.inf if value > 0 else -math.inf
    if (
        math.isnan(number)
        or (finite and math.isinf(number))
        or (low is not None and (number <= low if low_open else number < low))
        or (high is not None and (number >= high if high_open else number > high))
    ):
        shown = value if type(value) in (int, float) else number
        raise ValueError(f"{name} must be {expected}, got {reprlib.repr(shown)}")
    return number


def check_positive(value, name, allow_none=False):
    """A finite real number ``> 0``, as a ``float``: :func:`check_real` with ``low=0`` open."""
    return check_real(value, name, low=0, low_open=True, allow_none=allow_none)


def check_choice(value, name, choices, allow_none=False):
    """
    One of the strings ``choices``; ``None`` passes through with ``allow_none``.

    :raises TypeError: if ``value`` is not a ``str``.
    :raises ValueError: if it is not one of ``choices``.
    """
    if value is None and allow_none:
        return None
    expected = "one of " + ", ".join(repr(c) for c in choices) + (" or None" if allow_none else "")
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, {expected}; got {_got(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be {expected}; got {value!r}")
    return value


def as_real_tensor(x, name, device=None):
    """``x`` as a real tensor, or a :class:`TypeError` naming the argument (torch's own
    error for a string or a ragged list names neither). With ``device`` (where the data an
    argument meets live): a list or an array is made there, and a tensor elsewhere is
    refused with a :class:`ValueError` (a silent copy at every call would hide it)."""
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a real tensor or array of numbers, got a string")
    if torch.is_tensor(x):
        if device is not None and not same_device(x.device, device):
            raise ValueError(
                f"{name} must be on {device}, where the data it meets are, got {x.device}: "
                f"move it there (e.g. {name}.to('{device}'))"
            )
    else:
        try:
            x = torch.as_tensor(x, device=device)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(
                f"{name} must be a real tensor or array of numbers, got {type(x).__name__} "
                f"({error})"
            ) from None
    if x.is_complex():
        raise TypeError(f"{name} must be real, got dtype {x.dtype}")
    return x


def same_device(a, b):
    """Whether devices ``a`` and ``b`` are one (``"cuda"`` is the current CUDA device, as
    torch places it, so it equals ``cuda:0`` there)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type == "cuda":
        current = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return (a.index if a.index is not None else current) == (
            b.index if b.index is not None else current
        )
    return a.index == b.index or a.index is None or b.index is None


def check_real_tensor(value, name):
    """
    A :class:`torch.Tensor` of a real dtype (floating point, ``bool``, ``int32`` or
    ``int64``), returned as it is; its values are not read.

    :raises TypeError: if ``value`` is not a tensor, or is complex or of another dtype.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not (value.is_floating_point() or value.dtype in (torch.bool, torch.int32, torch.int64)):
        raise TypeError(f"{name} must be a real tensor, got dtype {value.dtype}")
    return value


def check_same_device(**tensors):
    """Refuse tensors that live on different devices, naming each with its device:
    ``check_same_device(sales=y, spend=u)``. ``None`` values are skipped; the first named
    tensor's device is the one the others must share (it is returned)."""
    given = [(name, value) for name, value in tensors.items() if value is not None]
    if not given:
        return None
    first_name, first = given[0]
    for name, value in given[1:]:
        if not same_device(value.device, first.device):
            raise ValueError(
                f"{name} must be on the device of {first_name} ({first.device}), got "
                f"{value.device}: move it there (e.g. {name}.to('{first.device}'))"
            )
    return first.device


def first_nonfinite(value: torch.Tensor) -> tuple | None:
    """The index of the first NaN or infinite entry of a floating tensor (``None`` if none,
    or for an integer tensor): one reduction, and the search only when there is one."""
    if not value.is_floating_point():
        return None
    # A finite sum has no NaN or infinite term (a NaN, or an inf not cancelled by another,
    # makes it non-finite): one cheap reduction decides the common case (a third of
    # isfinite's cost, which per-round checks feel); only a sum that overflows, or a bad
    # entry, takes the exact search.
    if math.isfinite(value.sum().item()):
        return None
    bad = ~torch.isfinite(value)
    if not bool(bad.any()):
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


def values_checked() -> bool:
    """
    Whether to check tensor values (label ranges, NaN, negative variances, failed
    factorisations), not only shapes and dtypes.

    These checks follow Pyro's global validation switch (``pyro.enable_validation`` /
    ``pyro.validation_enabled``), which also sets distributions' own argument and sample
    checks. Samplers turn validation off while they evaluate potentials: a particle that
    strays into an invalid region then gets a NaN log density (reported as a divergence)
    instead of an exception, ``torch.func.vmap`` (which cannot branch on values) can batch
    the model, and a traced, compiled step never reads a tensor on the host.

    Pyro's switch, not torch.distributions' default ``Distribution._validate_args``: the
    first ``torch.compile`` of a process turns that default off for good (TorchDynamo's
    patches), which would silently switch every value check off from then on.
    """
    return pyro_validation_enabled()
