r"""
A whole SG-MCMC step as one compiled function.

The pure step :func:`~.step.step`, the eager kernel's, is traced once with the Pyro model,
with :func:`torch.fx.experimental.proxy_tensor.make_fx`, into a function of (sampler state,
noise, step size, minibatch indices, model arguments) that contains everything a step does: the potential's gradient for all ``L`` particles
(vectorised as the potential says), the repulsion coupling, the preconditioner and momentum
state, the noise and the update, and a finiteness flag. Pyro's handlers and every other
Python-level cost run only while tracing; what remains is a graph of tensor operations,
which ``jit_compile="trace"`` runs as it is and ``jit_compile=True`` compiles with
TorchInductor, the compiler behind :func:`torch.compile`. On the CPU the graph goes to
inductor directly (:func:`torch._inductor.compile`, which exists for graphs captured
without dynamo): this class keys compiled graphs by shapes itself, so dynamo's frame guards
would only add per-call overhead. On CUDA it goes through :func:`torch.compile` with
``compile_mode`` (``"reduce-overhead"`` replays the whole step as one CUDA graph). The
compiled graphs land in inductor's on-disk cache, so a later run of the same model and
shapes compiles in about a second.

Randomness stays outside: the kernel draws the minibatch indices and the standard normal
noise with the global generator, in the order its eager step does, and passes them in. So
the compiled chain is the eager chain, up to float32 round-off, for the same seed; and the
step size, the adaptation switch and the data enter as tensors, so none of them triggers a
recompilation. The model's tensors keep their shapes from step to step; when they change
(a new data set, a smaller last batch), the step is traced and compiled again, once per
new set of shapes, with a warning.

A step whose potential, gradient or new particles are not finite (or whose repulsive
noise could not be factorised at the first jitter) returns a false flag, computed inside
the graph. The kernel reads it every step on the CPU and redoes such a step eagerly from
the same inputs, which either succeeds (retrying the factorisation) or raises
:class:`~pyro_ext.infer.SamplerDivergenceError` with the eager diagnosis; on an accelerator it
reads the flags every few steps and replays from the last verified state (see
``divergence_check_every`` of :class:`~.kernels.SGMCMCKernel`).
"""

import contextlib
import logging
import time
import warnings
from typing import NamedTuple

import pyro
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree

from ...ops.validation import check_choice
from .step import step as pure_step

logger = logging.getLogger(__name__)

#: the kinds ``jit_compile`` accepts (``True`` is ``"compile"``)
JIT_COMPILE = (False, True, "trace", "compile")
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_jit_compile(jit_compile, compile_mode):
    """Validate the kernels' ``jit_compile`` and ``compile_mode`` arguments."""
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


@contextlib.contextmanager
def _without_sample_checks():
    """
    Skip distributions' checks that a scored value lies in their support while tracing.

    :func:`pyro.validation_enabled` turns them off only for distributions built inside it;
    one built earlier with checks on (a ``PyroModule``'s cached priors, say) still checks
    each value, and that check branches on tensor values, which a trace cannot follow.
    The values scored here are images of unconstrained particles: always in the support.
    """
    original = torch.distributions.Distribution._validate_sample
    torch.distributions.Distribution._validate_sample = lambda self, value: None
    try:
        yield
    finally:
        torch.distributions.Distribution._validate_sample = original


class ModelNotTraceableError(RuntimeError):
    """The model cannot be traced into a compiled step; the message says why and what to do."""


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


def _check_static_shapes(graph):
    """
    Refuse a traced step that selects elements by value (boolean-mask reads, ``nonzero``,
    ``masked_select``, ``unique``): the trace records the sizes of the minibatch it saw, so
    the next minibatch would break it. Assignment through a mask keeps the shape and passes.
    A selection whose size happens to be the same at every step (a mask over the full data,
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
                "one minibatch to the next, and a traced step keeps the sizes it saw. Keep the "
                "shapes fixed: weight by a 0/1 mask (log_prob * mask, or pyro.poutine.mask) "
                f"instead of selecting; or run the kernel eagerly with jit_compile=False. "
                f"(Traced operation: {node.target}.)"
            )


class _Constant:
    """A non-tensor model argument, compared by value when it is a plain value, else by identity."""

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


def _data_spec(args, kwargs):
    """
    Leaves of the model arguments and a hashable key of what the trace depends on: the
    tensors' shapes (they are inputs of the traced step) and the other values themselves
    (they are constants of it).
    """
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    key = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            key.append((tuple(leaf.shape), leaf.dtype, leaf.device, leaf.requires_grad))
        else:
            key.append(_Constant(leaf))
    return leaves, spec, (spec, tuple(key))


class StepOutput(NamedTuple):
    state: tuple
    log_density: torch.Tensor
    ok: torch.Tensor


class CompiledStep:
    """
    The traced (and compiled) step of one :class:`~.kernels.SGMCMCKernel`.

    :param potential: the kernel's :class:`~pyro_ext.infer.potential.ParticlePotential`.
    :param sampler: the registry entry (:class:`~.updates.Sampler`).
    :param dict hyper: the sampler's hyper-parameters.
    :param float temperature: the noise temperature.
    :param repulsion: ``None`` or a :class:`pyro.infer.svgd.SteinKernel`.
    :param str kind: ``"trace"`` or ``"compile"``.
    :param str compile_mode: passed to :func:`torch.compile`; ``None`` picks
        ``"reduce-overhead"`` (CUDA graphs) on CUDA and the default elsewhere.
    :param shard: the kernel's :class:`~.distributed.Shard`, or ``None``: the step's
        collectives (functional, so traced into the graph like any operation).
    """

    def __init__(
        self,
        potential,
        sampler,
        hyper,
        temperature,
        repulsion,
        kind,
        compile_mode=None,
        shard=None,
    ):
        self.potential, self.sampler, self.hyper = potential, sampler, dict(hyper)
        self.temperature, self.repulsion = temperature, repulsion
        self.kind, self.compile_mode = kind, compile_mode
        self.shard = shard
        self._fns: dict[tuple, object] = {}
        self._last = None  # (args, kwargs, key, fn, data tensors, subsample names) of last step
        self.trace_seconds = 0.0
        self.compile_seconds = 0.0
        self.num_traces = 0
        self._pending_first_call = set()
        self._cudagraphs = False

    # -- the traced step --------------------------------------------------------------------
    def _pure_step(self, state_type, data_spec, subsample_names, discrete_names, leaves):
        potential, sampler, hyper = self.potential, self.sampler, self.hyper
        temperature, repulsion, shard = self.temperature, self.repulsion, self.shard
        num_state = len(state_type._fields)
        num_subsamples = len(subsample_names)
        num_discrete = len(discrete_names)

        def step(*inputs):
            state = state_type(*inputs[:num_state])
            noise, step_size, adapt = inputs[num_state : num_state + 3]
            rest = inputs[num_state + 3 :]
            subsamples = dict(zip(subsample_names, rest[:num_subsamples]))
            rest = rest[num_subsamples:]
            # The discrete sites' values (a Gibbs move changes them between steps): inputs
            # of the graph, never constants of it.
            conditioned = dict(zip(discrete_names, rest[:num_discrete]))
            tensors = iter(rest[num_discrete:])
            args, kwargs = pytree.tree_unflatten(
                [next(tensors) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
                data_spec,
            )

            def gradient(z, batch):
                # The potential's gradient in a form the trace follows (the eager step
                # takes it with torch.autograd from the same log density).
                def total(z):
                    log_density = potential.log_density_all(z, batch, args, kwargs, conditioned)
                    return log_density.sum(), log_density

                grad, log_density = torch.func.grad(total, has_aux=True)(z)
                return log_density, grad

            new_state, info = pure_step(
                state,
                subsamples,
                noise,
                step_size,
                gradient=gradient,
                update=lambda s, g, e, n, c: sampler.update(
                    s, g, e, n, c, temperature, adapt, **hyper
                ),
                repulsion=repulsion,
                shard=shard,
                tries=1,
                bandwidth_gradient=temperature != 0,
            )
            return (*new_state, info.log_density, info.ok)

        return step

    def _build(self, key, state, inputs, data_spec, subsample_names, discrete_names, leaves):
        state_type = type(state)
        if self.potential.vectorize is None and state.z.shape[0] > 1:
            # vectorize="auto": settle vmap or plate eagerly, so that the trace holds only
            # the path taken (no dead nodes of a failed vmap attempt).
            after_state = inputs[len(state) + 3 :]
            subsamples = dict(zip(subsample_names, after_state))
            conditioned = dict(zip(discrete_names, after_state[len(subsample_names) :]))
            with torch.no_grad(), pyro.validation_enabled(False):
                self.potential.log_density_all(state.z, subsamples, conditioned=conditioned)
        step = self._pure_step(state_type, data_spec, subsample_names, discrete_names, leaves)
        started = time.perf_counter()
        with pyro.validation_enabled(False), _without_sample_checks(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # tracer notes on scalars
            graph = make_fx(step)(*inputs)
        graph.graph.eliminate_dead_code()
        graph.recompile()
        _check_static_shapes(graph)
        self.trace_seconds += time.perf_counter() - started
        self.num_traces += 1
        if self.kind == "trace":
            return graph
        mode = self.compile_mode
        if mode is None and state.z.is_cuda:
            mode = "reduce-overhead"
        if not state.z.is_cuda:
            # The graph is already a traced aten graph, and this class keys it by shapes:
            # inductor alone compiles it, without dynamo's frame guards (half the per-call
            # overhead of torch.compile on a small model).
            started = time.perf_counter()
            options = {} if mode in (None, "default") else torch._inductor.list_mode_options(mode)
            # Fake example inputs with a shape environment (shapes kept static) let inductor
            # use its on-disk graph cache: a later run of the same model compiles in a second.
            fake_mode = FakeTensorMode(shape_env=ShapeEnv())
            examples = [fake_mode.from_tensor(t, static_shapes=True) for t in inputs]
            try:
                compiled = torch._inductor.compile(graph, examples, options=options)
            except Exception as error:  # an inductor limitation must not stop the chain
                self.compile_seconds += time.perf_counter() - started
                warnings.warn(
                    "jit_compile=True: TorchInductor could not compile this model's step "
                    f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); it runs "
                    "as the traced graph instead (jit_compile='trace': the same results, "
                    "slower). Pass jit_compile='trace' to skip the attempt.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return graph
            self.compile_seconds += time.perf_counter() - started
            self._log_compile_time()
            return compiled
        self._cudagraphs = mode in ("reduce-overhead", "max-autotune")
        self._pending_first_call.add(key)
        return torch.compile(
            graph, mode=None if mode == "default" else mode, dynamic=False, fullgraph=True
        )

    def _log_compile_time(self):
        logger.info(
            "pyro_ext: SG-MCMC step traced in %.1f s and compiled in %.1f s",
            self.trace_seconds,
            self.compile_seconds,
        )

    def _trace(self, key, state, inputs, data_spec, subsample_names, discrete_names, leaves):
        try:
            return self._build(
                key, state, inputs, data_spec, subsample_names, discrete_names, leaves
            )
        except RuntimeError as error:
            if "_local_scalar_dense" not in str(error) and "data-dependent" not in str(error):
                raise
            raise ModelNotTraceableError(
                "jit_compile: the model needs a tensor's value on the host while tracing: it "
                "branches on a latent value (if, bool(tensor), .item()), or reads its data "
                "as a Python number (e.g. int(y.sum())). A traced step cannot follow either. "
                "Write such a branch with torch.where; compute numbers from the data outside "
                "the model and pass them as Python numbers (they are constants of the trace); "
                "or run the kernel eagerly with jit_compile=False. Tracing stopped with: "
                f"{str(error).splitlines()[0][:200]}"
            ) from error

    # -- calling ---------------------------------------------------------------------------
    def __call__(
        self, state, noise, step_size, adapt, subsamples, conditioned, args, kwargs
    ) -> StepOutput:
        """One step from ``state``; ``conditioned`` holds the discrete sites' per-particle
        values (empty without discrete sites), inputs of the graph like the data."""
        last = self._last
        if last is not None and last[0] is args and last[1] is kwargs:
            # The same arguments as last step (no set_data since): same shapes, same graph.
            _, _, key, fn, data_tensors, subsample_names = last
            inputs = (
                *state,
                noise,
                step_size,
                adapt,
                *(subsamples[n] for n in subsample_names),
                *(conditioned[n] for n in sorted(conditioned)),
                *data_tensors,
            )
        else:
            key, fn, inputs, subsample_names = self._lookup(
                state, noise, step_size, adapt, subsamples, conditioned, args, kwargs
            )
            data_tensors = inputs[len(state) + 3 + len(subsample_names) + len(conditioned) :]
            self._last = (args, kwargs, key, fn, data_tensors, subsample_names)
        return self._run(key, fn, state, inputs)

    def _lookup(self, state, noise, step_size, adapt, subsamples, conditioned, args, kwargs):
        subsample_names = tuple(sorted(subsamples))
        discrete_names = tuple(sorted(conditioned))
        leaves, data_spec, data_key = _data_spec(args, kwargs)
        shapes = (
            tuple((tuple(t.shape), t.dtype) for t in state)
            + tuple(tuple(subsamples[n].shape) for n in subsample_names)
            + tuple((tuple(conditioned[n].shape), conditioned[n].dtype) for n in discrete_names)
        )
        key = (type(state), shapes, subsample_names, discrete_names, data_key)
        inputs = (
            *state,
            noise,
            step_size,
            adapt,
            *(subsamples[n] for n in subsample_names),
            *(conditioned[n] for n in discrete_names),
            *(leaf for leaf in leaves if isinstance(leaf, torch.Tensor)),
        )
        fn = self._fns.get(key)
        if fn is None:
            if len(self._fns) >= 2:
                # A second shape is common (an epoch's last, smaller batch); more are not.
                warnings.warn(
                    f"jit_compile: the model's arguments changed shape (or a non-tensor "
                    f"argument changed value) again; tracing and compiling the step for the "
                    f"{len(self._fns) + 1}th time. Keep minibatch shapes fixed to compile once.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            fn = self._fns[key] = self._trace(
                key, state, inputs, data_spec, subsample_names, discrete_names, leaves
            )
        return key, fn, inputs, subsample_names

    def _run(self, key, fn, state, inputs):
        if self._cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        first = key in self._pending_first_call
        if first:
            started = time.perf_counter()
        outputs = fn(*inputs)
        if first:
            self._pending_first_call.discard(key)
            self.compile_seconds += time.perf_counter() - started
            self._log_compile_time()
        num_state = len(state)
        if self._cudagraphs:
            # A CUDA graph's outputs live in its static memory and are overwritten by the
            # next replay; the kernel keeps this state (and may redo the step from it).
            outputs = [output.clone() for output in outputs]
        new_state = type(state)(*outputs[:num_state])
        return StepOutput(new_state, outputs[num_state], outputs[num_state + 1])
