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

import logging
import time
import warnings
from typing import NamedTuple

import pyro
import torch
from torch.utils import _pytree as pytree

from ..tracing import compile_graph, data_spec, trace_pure
from .step import step as pure_step

logger = logging.getLogger(__name__)


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
    def _pure_step(self, state_type, spec, subsample_names, discrete_names, leaves):
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
                spec,
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

    def _build(self, key, state, inputs, spec, subsample_names, discrete_names, leaves):
        state_type = type(state)
        if self.potential.vectorize is None and state.z.shape[0] > 1:
            # vectorize="auto": settle vmap or plate eagerly, so that the trace holds only
            # the path taken (no dead nodes of a failed vmap attempt).
            after_state = inputs[len(state) + 3 :]
            subsamples = dict(zip(subsample_names, after_state))
            conditioned = dict(zip(discrete_names, after_state[len(subsample_names) :]))
            with torch.no_grad(), pyro.validation_enabled(False):
                self.potential.log_density_all(state.z, subsamples, conditioned=conditioned)
        step = self._pure_step(state_type, spec, subsample_names, discrete_names, leaves)
        started = time.perf_counter()
        graph = trace_pure(step, inputs, "run the kernel eagerly with jit_compile=False")
        self.trace_seconds += time.perf_counter() - started
        self.num_traces += 1
        if self.kind == "trace":
            return graph
        fn, seconds, cudagraphs = compile_graph(graph, inputs, self.compile_mode, "step")
        if state.z.is_cuda:
            # torch.compile compiles at the first call: _run times it.
            self._cudagraphs = cudagraphs
            self._pending_first_call.add(key)
        else:
            self.compile_seconds += seconds
            self._log_compile_time()
        return fn

    def _log_compile_time(self):
        logger.info(
            "pyro_ext: SG-MCMC step traced in %.1f s and compiled in %.1f s",
            self.trace_seconds,
            self.compile_seconds,
        )

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
        leaves, spec, data_key = data_spec(args, kwargs)
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
            fn = self._fns[key] = self._build(
                key, state, inputs, spec, subsample_names, discrete_names, leaves
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
