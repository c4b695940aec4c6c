r"""
One SG-MCMC step as a pure function: the step that every path runs.

:func:`step` takes the sampler state, the minibatch, standard normal noise and the step
size, and returns the new state and a :class:`StepInfo`: the gradient of the log density
at the particles (from the ``gradient`` function the caller passes: the potential's), the
repulsion coupling, the sampler's update and a finiteness flag. It draws no random numbers
and keeps no state, so

* the eager kernel (:class:`~.kernels.SGMCMCKernel`) calls it with the potential's
  autograd gradient and the sampler's update;
* the compiled step (:mod:`~.compiled`) traces it, with the potential's gradient written
  with :func:`torch.func.grad` so that the trace follows it;
* a sharded run (:mod:`~.distributed`) passes its :class:`~.distributed.Shard`, whose
  collectives :func:`transition` calls around the coupling and the update.

Registering a sampler (an ``(init_state, update)`` pair in :data:`~.updates.SAMPLERS`) is
all a new kernel needs: the step, its compilation and its sharding come with it.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

from .repulsion import stein_coupling


class StepInfo(NamedTuple):
    """What a step computed besides the new state: the log densities ``(L,)`` and their
    gradients ``(L, D)`` at the step's start that the update used (averaged over data
    shards), and a 0-dim flag, whether the step is finite on every rank."""

    log_density: torch.Tensor
    grad: torch.Tensor
    ok: torch.Tensor


def transition(
    update,
    state,
    grad,
    log_density,
    step_size,
    noise,
    repulsion,
    shard=None,
    tries=None,
    bandwidth_gradient=True,
    positions=None,
):
    """
    One sampler transition from this rank's gradient (the second half of :func:`step`).
    ``update(state, grad, step_size, noise, coupling)`` is the sampler's update; ``noise``
    holds standard normal noise for all ``L`` particles (``shard`` picks this rank's rows);
    ``tries`` overrides the coupling's Cholesky tries (1 in a traced step);
    ``bandwidth_gradient`` whether the repulsion carries the median bandwidth's dependence
    on the particles (see :func:`~.repulsion.stein_coupling`: the noisy samplers need it,
    SVGD holds the bandwidth constant). Returns the new state of this rank's particles and
    a :class:`StepInfo`. The finiteness flag takes one reduction and no host sync (a
    non-finite gradient makes the new particles non-finite too). ``positions``: the
    gather of all ranks' positions a row-sharded step started (see :func:`step`).
    """
    coupled = repulsion is not None
    if coupled and shard is not None and shard.shards_rows(repulsion):
        # This rank's rows of the kernel matrix, drift and noise (see RowCoupling): the
        # update runs on this rank's particles only.
        coupling = shard.row_coupling(
            repulsion, state.z, grad, noise, bandwidth_gradient, tries, positions
        )
        new_state = update(state, grad, step_size, shard.local(noise), coupling)
        ok = shard.all_true(torch.isfinite(log_density.sum() + new_state.z.sum()))
        return new_state, StepInfo(log_density, grad, ok)
    if shard is not None:
        state, grad, log_density, noise = shard.enter(state, grad, log_density, noise, coupled)
    coupling = None
    if coupled:
        coupling = stein_coupling(repulsion, state.z, bandwidth_gradient)
        if tries is not None:
            coupling = coupling._replace(cholesky_tries=tries)
    new_state = update(state, grad, step_size, noise, coupling)
    ok = torch.isfinite(log_density.sum() + new_state.z.sum())
    if shard is not None:
        new_state, grad, log_density, ok = shard.leave(new_state, grad, log_density, ok, coupled)
    return new_state, StepInfo(log_density, grad, ok)


def step(
    state,
    batch,
    noise,
    step_size,
    *,
    gradient: Callable,
    update: Callable,
    repulsion=None,
    shard=None,
    tries=None,
    bandwidth_gradient=True,
):
    """
    One SG-MCMC step: ``(state, batch, noise, step_size) -> (new_state, info)``.

    :param state: the sampler state (a named tuple whose ``z`` are this rank's particles
        ``(L, D)``; see :data:`~.updates.SAMPLERS`).
    :param dict batch: the minibatch indices of each subsampled plate.
    :param torch.Tensor noise: standard normal noise for all ``L`` particles of the run.
    :param step_size: a positive number or a 0-dim tensor.
    :param callable gradient: ``gradient(z, batch) -> (log_density, grad)``, the log
        densities ``(L,)`` of the particles on the minibatch and their gradients.
    :param callable update: ``update(state, grad, step_size, noise, coupling) -> state``,
        the sampler's update with its hyper-parameters bound.
    :param repulsion: ``None`` or a :class:`pyro.infer.svgd.SteinKernel`.
    :param shard: ``None``, or the :class:`~.distributed.Shard` of a sharded run.
    :param int tries: the coupling's Cholesky tries (``None``: its default).
    :param bool bandwidth_gradient: see :func:`transition`.
    :returns: the new state and a :class:`StepInfo`.
    """
    positions = None
    if (
        repulsion is not None
        and shard is not None
        and shard.overlaps
        and shard.shards_rows(repulsion)
    ):
        # The positions are known before the gradients: they travel while those are
        # computed (a row-sharded step needs every rank's; see Shard.overlaps).
        positions = shard.start_gather(state.z)
    log_density, grad = gradient(state.z, batch)
    return transition(
        update,
        state,
        grad,
        log_density,
        step_size,
        noise,
        repulsion,
        shard,
        tries=tries,
        bandwidth_gradient=bandwidth_gradient,
        positions=positions,
    )
