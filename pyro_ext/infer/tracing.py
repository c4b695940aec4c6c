r"""
Tracing a pure function of tensors that runs a Pyro model into one graph, and compiling
that graph: what the compiled SG-MCMC step (:mod:`~pyro_ext.infer.sgmcmc.compiled`) and
the compiled online filters (:class:`~pyro_ext.online.BONG` with ``jit_compile=True``)
share.

The function is traced once with :func:`torch.fx.experimental.proxy_tensor.make_fx`:
Pyro's handlers and every other Python-level cost run only while tracing, and what
remains is a graph of aten operations. The caller keys graphs by its inputs' shapes
(:func:`data_spec`), so the graph's shapes are static. :func:`compile_graph` hands the
graph to TorchInductor directly on the CPU (:func:`torch._inductor.compile`, for graphs
captured without dynamo: dynamo's frame guards would only add per-call overhead) and
through :func:`torch.compile` on CUDA, where ``"reduce-overhead"`` replays it as one CUDA
graph. The compiled graphs land in inductor's on-disk cache, so a later run of the same
model and shapes compiles in about a second.
"""

import contextlib
import functools
import time
import warnings

import pyro
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree

from ..ops.validation import check_choice

__all__ = [
    "ModelNotTraceableError",
    "check_jit_compile",
    "compile_graph",
    "data_spec",
    "trace_pure",
]


#: the kinds ``jit_compile`` accepts (``True`` is ``"compile"``)
JIT_COMPILE = (False, True, "trace", "compile")
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_jit_compile(jit_compile, compile_mode):
    """Validate a ``jit_compile`` and ``compile_mode`` argument (SG-MCMC kernels, online filters)."""
    if not isinstance(jit_compile, (bool, str)):
        raise TypeError(
            f"jit_compile must be a bool or one of 'trace', 'compile'; got {type(jit_compile).__name__}"
        )
    if jit_compile not in JIT_COMPILE:
        raise ValueError(
            f"jit_compile must be False (eager), True (= 'compile': compile the traced step "
            f"with TorchInductor) or 'trace' (run the traced step uncompiled); got {jit_compile!r}"
        )
    check_choice(compile_mode, "compile_mode", COMPILE_MODES[1:], allow_none=True)
    if compile_mode is not None and jit_compile in (False, "trace"):
        raise ValueError(f"compile_mode={compile_mode!r} needs jit_compile=True")
    return "compile" if jit_compile is True else jit_compile


class ModelNotTraceableError(RuntimeError):
    """The model cannot be traced into a compiled step; the message says why and what to do."""


@contextlib.contextmanager
def without_sample_checks():
    """
    Skip distributions' checks that a scored value lies in their support while tracing.

    :func:`pyro.validation_enabled` turns them off only for distributions built inside it;
    one built earlier with checks on (a ``PyroModule``'s cached priors, say) still checks
    each value, and that check branches on tensor values, which a trace cannot follow.
    The caller checks the values it scores (they are images of unconstrained particles, or
    data checked once per shape and by value inside the graph).
    """
    original = torch.distributions.Distribution._validate_sample
    torch.distributions.Distribution._validate_sample = lambda self, value: None
    try:
        yield
    finally:
        torch.distributions.Distribution._validate_sample = original


_aten = torch.ops.aten
#: operations whose output's size depends on tensor values
_VALUE_SIZED = {
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten.argwhere.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
}


def _check_static_shapes(graph, fallback):
    """
    Refuse a traced function that selects elements by value (boolean-mask reads,
    ``nonzero``, ``masked_select``, ``unique``): the trace records the sizes it saw, so the
    next batch would break it. Assignment through a mask keeps the shape and passes. A
    selection whose size happens to be the same every time (a mask over the full data,
    say) is refused too: the trace cannot tell it apart.
    """
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        value_sized = node.target in _VALUE_SIZED
        if node.target is _aten.index.Tensor:
            indices = node.args[1] if len(node.args) > 1 else ()
            value_sized = any(
                getattr(index, "meta", {}).get("val") is not None
                and index.meta["val"].dtype in (torch.bool, torch.uint8)
                for index in indices
            )
        if value_sized:
            raise ModelNotTraceableError(
                "jit_compile: the model selects elements by value (boolean-mask indexing such "
                "as x[y > 0], nonzero, masked_select or unique), so its tensor sizes change from "
                "one batch to the next, and a traced step keeps the sizes it saw. Keep the "
                "shapes fixed: weight by a 0/1 mask (log_prob * mask, or pyro.poutine.mask) "
                f"instead of selecting; or {fallback}. (Traced operation: {node.target}.)"
            )


def trace_pure(fn, inputs, fallback="run it eagerly with jit_compile=False"):
    """
    Trace ``fn(*inputs)`` (tensors in, a tuple of tensors out) into an aten graph with
    :func:`~torch.fx.experimental.proxy_tensor.make_fx`, with Pyro's validation and the
    distributions' support checks off. A model that needs a tensor's value on the host or
    selects by value raises :class:`ModelNotTraceableError`, which ends with
    ``fallback`` (what the caller offers instead).
    """
    try:
        with (
            pyro.validation_enabled(False),
            without_sample_checks(),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", UserWarning)  # tracer notes on scalars
            graph = make_fx(fn)(*inputs)
    except RuntimeError as error:
        if "_local_scalar_dense" not in str(error) and "data-dependent" not in str(error):
            raise
        raise ModelNotTraceableError(
            "jit_compile: the model needs a tensor's value on the host while tracing: it "
            "branches on a latent value (if, bool(tensor), .item()), or reads its data "
            "as a Python number (e.g. int(y.sum())). A traced step cannot follow either. "
            "Write such a branch with torch.where; compute numbers from the data outside "
            f"the model and pass them as Python numbers (they are constants of the trace); "
            f"or {fallback}. Tracing stopped with: {str(error).splitlines()[0][:200]}"
        ) from error
    graph.graph.eliminate_dead_code()
    graph.recompile()
    _check_static_shapes(graph, fallback)
    return graph


def compile_graph(graph, inputs, mode=None, what="step", contiguous_inputs=False):
    """
    Compile a traced graph for ``inputs``' shapes. On the CPU: TorchInductor directly
    (``mode`` picks its options); an inductor limitation warns and returns the traced
    graph itself (the same results, slower). On CUDA: :func:`torch.compile` with ``mode``
    (``None``: ``"reduce-overhead"``, one CUDA graph), which compiles at its first call.
    ``contiguous_inputs``: the caller passes every input contiguous (:func:`contiguous`) at
    the shapes it keys the graph by, so the graph's per-call assertion of its inputs'
    sizes and strides (about 2 microseconds of a CPU call) is left out.

    Returns ``(fn, seconds, cudagraphs)``: the callable, the CPU compile time (0 on CUDA,
    where the first call compiles) and whether it replays CUDA graphs (whose outputs the
    next replay overwrites: the caller clones what it keeps).
    """
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
    if on_cuda:
        mode = "reduce-overhead" if mode is None else mode
        fn = torch.compile(
            graph, mode=None if mode == "default" else mode, dynamic=False, fullgraph=True
        )
        return fn, 0.0, mode in ("reduce-overhead", "max-autotune")
    started = time.perf_counter()
    options = {} if mode in (None, "default") else dict(torch._inductor.list_mode_options(mode))
    if contiguous_inputs and hasattr(torch._inductor.config, "size_asserts"):
        options["size_asserts"] = False
    # Fake example inputs with a shape environment (shapes kept static) let inductor use
    # its on-disk graph cache: a later run of the same model compiles in a second.
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    examples = [fake_mode.from_tensor(t, static_shapes=True) for t in inputs]
    try:
        with warnings.catch_warnings():
            # inductor's own deprecation notes (torch._prims_common.check), not the user's
            warnings.simplefilter("ignore", FutureWarning)
            fn = torch._inductor.compile(graph, examples, options=options)
    except Exception as error:  # an inductor limitation must not stop the run
        warnings.warn(
            f"jit_compile=True: TorchInductor could not compile this model's {what} "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); it runs as the "
            "traced graph instead (jit_compile='trace': the same results, slower). Pass "
            "jit_compile='trace' to skip the attempt.",
            RuntimeWarning,
            stacklevel=3,
        )
        fn = graph
    return fn, time.perf_counter() - started, False


class _Constant:
    """A non-tensor argument, compared by value when it is a plain value, else by identity."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def _key(self):
        value = self.value
        if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            return (type(value), value)
        return (type(value), id(value))

    def __eq__(self, other):
        return isinstance(other, _Constant) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


@functools.cache
def _tensors_spec(count):
    """The tree spec of ``((tensor,) * count, {})``."""
    return pytree.tree_flatten((tuple(torch.zeros(()) for _ in range(count)), {}))[1]


def contiguous(values):
    """``values`` (a sequence) with every tensor among them made contiguous. A compiled
    graph is specialised to its example inputs' strides (inductor asserts them at every
    call), and its callers key graphs by shape: a column-major (Fortran-ordered) batch, or
    a column of one, would otherwise stop a graph compiled for row-major data."""
    return [
        v.contiguous() if isinstance(v, torch.Tensor) and not v.is_contiguous() else v
        for v in values
    ]


def data_spec(args, kwargs):
    """
    Leaves of a model's arguments and a hashable key of what a trace depends on: the
    tensors' shapes, dtypes and devices (they are inputs of the traced function) and the
    other values themselves (they are constants of it). Tensor leaves come contiguous
    (:func:`contiguous`).
    """
    if not kwargs and all(isinstance(arg, torch.Tensor) for arg in args):
        # The common call of a compiled update or step (tensors only), once per update:
        # without the general flattening, which costs tens of microseconds.
        args = tuple(contiguous(args))
        key = tuple((tuple(a.shape), a.dtype, a.device, a.requires_grad) for a in args)
        # The number of tensors stands for the spec in the key: hashing a spec costs
        # microseconds (pytree hashes it node by node), and no general key equals it.
        return list(args), _tensors_spec(len(args)), (len(args), key)
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    leaves = contiguous(leaves)
    key = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            key.append((tuple(leaf.shape), leaf.dtype, leaf.device, leaf.requires_grad))
        else:
            key.append(_Constant(leaf))
    return leaves, spec, (spec, tuple(key))
