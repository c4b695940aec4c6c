r"""
SG-MCMC over :mod:`torch.distributed`: particles or minibatches sharded across processes.

A script launched as ``torchrun --nproc-per-node=R script.py`` (or by any launcher that
initialises a process group) runs the same kernel as on one process; the kernel shards its
work over the group's ``R`` ranks in one of two ways (``shard=`` of
:class:`~.kernels.SGMCMCKernel`):

``"particles"`` (the default under a process group of more than one rank)
    Each rank holds ``L / R`` of the ``L`` particles and evaluates their gradients.
    Independent particles exchange nothing but one finiteness flag per step. The
    repulsive samplers (thesis eq. 2.7-2.8) with the :class:`~.repulsion.RBFKernel` are
    sharded by rows of the kernel matrix ``K``: one ``all_gather`` per step of the
    particles' positions and gradients (``O(L D)`` numbers; an eager step on gloo sends it
    in pieces, see :meth:`Shard.start_gather`), then each rank computes only
    its ``L / R`` rows of the squared distances (``O(L^2 D / R)``), gathers those rows
    (``L^2`` numbers) to form ``K`` and the median bandwidth, and applies its rows of the
    drift ``K (grad - s) + rowsum(K) s`` plus the bandwidth term, and of the correlated
    noise (the ``L x L`` Cholesky factor is replicated, its rows times the noise are not):
    ``O(L^2 D / R)`` arithmetic per rank (:class:`RowCoupling`). The momentum samplers
    gather their new velocities once more for ``K v / L``. Other Stein kernels gather the
    whole state and apply the update on every rank (replicated, ``O(L^2 D)`` each).

``"data"``
    Every rank holds all ``L`` particles and evaluates them on its share of the
    minibatch; the gradients are averaged with one ``all_reduce`` (the pattern of
    :class:`torch.nn.parallel.DistributedDataParallel`). The model's subsampled plate
    gives the per-rank minibatch size ``b``, as a DDP script gives the per-process batch:
    the global minibatch is ``R b``, drawn once from the shared random stream and split
    between the ranks, and rank ``r``'s log density ``log p(z) + (N / b) sum_{i in
    chunk_r} log p(x_i | z)`` averages over ranks to the potential of the whole ``R b``
    minibatch.

All ranks draw the same random numbers (minibatch indices, noise for all ``L`` particles,
initial particles), so a run on ``R`` ranks is the single-process run with the same seed,
up to float32 round-off (the gradients of fewer particles, or of a chunk of the minibatch,
are summed in another order). The collectives are PyTorch's functional collectives,
which a compiled step (``jit_compile``) traces into its graph like any other operation.

A rank that fails (an exception, a killed process) makes the others' next collective fail;
:class:`RankFailedError` then says so instead of a backend error. A rank that hangs
without exiting is caught by the process group's own ``timeout`` (an argument of
:func:`torch.distributed.init_process_group`).
"""

import hashlib
import math
import pickle

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ...ops.tracing import is_traced
from ...ops.validation import check_choice
from .repulsion import Coupling, RBFKernel, noise_factor, shifted_drift

#: the values ``shard`` takes
SHARD_MODES = ("auto", "particles", "data", None)
#: backends whose collectives are supported, by device type of the particles
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
# The traceable all-gather along dim 0: ``all_gather_single`` (missing from torch 2.11, as
# seen on a GPU machine), else ``all_gather_tensor``, its older name (same signature).
_all_gather_single = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
#: the size of each piece of an eager gloo gather (see :meth:`Shard.start_gather`)
GLOO_PIECE_BYTES = 1 << 21


class _Gathering:
    """An eager gather in flight: its output and the work handles of its pieces."""

    __slots__ = ("out", "works")

    def __init__(self, out, works):
        self.out, self.works = out, works


class RankFailedError(RuntimeError):
    """
    Another rank of a sharded run stopped (an exception, or its process died) and this
    rank's collective failed with it. Restart the job; with ``checkpoint_path``,
    :meth:`pyro_ext.infer.MCMC.resume` continues from the last checkpoint.
    """

    def __init__(self, step, rank, world_size, cause):
        self.step, self.rank, self.world_size = step, rank, world_size
        super().__init__(
            f"rank {rank} of {world_size}: a collective failed at step {step}, so another rank "
            f"stopped or died ({type(cause).__name__}: {str(cause).splitlines()[0][:200]}). "
            "Look for that rank's own error; restart the job, and resume from the last "
            "checkpoint if the run had a checkpoint_path."
        )

    def __reduce__(self):
        return (_rank_failed, (self.args[0], self.step, self.rank, self.world_size))


def _rank_failed(message, step, rank, world_size):
    error = RuntimeError.__new__(RankFailedError)
    RuntimeError.__init__(error, message)
    error.step, error.rank, error.world_size = step, rank, world_size
    return error


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a failed collective (a peer gone), not an error of the model."""
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text
        for marker in (
            "Connection closed by peer",
            "Connection reset by peer",
            "Broken pipe",
            "Gloo",
            "gloo",
            "NCCL",
            "ProcessGroup",
            "Timed out",
        )
    )


def _layout_digest(obj) -> str:
    return hashlib.sha256(pickle.dumps(obj)).hexdigest()[:16]


def _tensor_digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().cpu().contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


class RowCoupling(Coupling):
    """
    A rank's rows of the :class:`~.repulsion.Coupling` of a sharded run: what the update
    functions of :mod:`pyro_ext.infer.sgmcmc.updates` read (:meth:`drift`,
    :meth:`couple`, :meth:`correlate`) for this rank's ``n = L / R`` particles, each
    ``O(n L D)``.

    :ivar matrix: the whole ``(L, L)`` kernel matrix (``O(L^2)``, for the Cholesky factor).
    :ivar rows: this rank's rows, a ``slice``.
    :ivar shift: ``s = 2 z / h`` of every particle, ``(L, D)``.
    :ivar bandwidth_term: this rank's rows of the bandwidth term ``(n, D)``, or ``None``.
    :ivar every_grad: every particle's gradient ``(L, D)``.
    :ivar every_noise: the whole run's standard normal noise ``(L, D)``: the correlated
        noise of a row mixes every particle's.
    :ivar gather: the collective that gathers the ranks' rows (for :meth:`couple`).
    """

    __slots__ = ("rows", "every_grad", "every_noise", "gather")

    def __init__(
        self, matrix, shift, bandwidth_term, rows, every_grad, every_noise, gather, tries=6
    ):
        super().__init__(matrix, cholesky_tries=tries, shift=shift, bandwidth_term=bandwidth_term)
        self.rows, self.every_grad, self.every_noise, self.gather = (
            rows,
            every_grad,
            every_noise,
            gather,
        )

    @property
    def repulsion(self) -> torch.Tensor:
        matrix = self.matrix[self.rows]
        repulsion = matrix.sum(-1, keepdim=True) * self.shift[self.rows] - matrix @ self.shift
        if self.bandwidth_term is not None:
            repulsion = repulsion + self.bandwidth_term
        return repulsion

    def drift(self, grad: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the drift, from every particle's gradient (``grad`` holds
        this rank's rows, the same values)."""
        rows, shift = self.rows, self.shift
        return shifted_drift(
            self.matrix[rows], shift[rows], shift, self.every_grad, self.bandwidth_term
        )

    def couple(self, velocity: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``K v / L``: the ranks' velocities ``(n, D)`` gathered."""
        return self.matrix[self.rows] @ self.gather(velocity) / self.matrix.shape[0]

    def correlate(self, noise: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the correlated noise ``chol(K) eta / sqrt(L)`` (``noise``
        holds this rank's rows of ``eta``; the row mixes every particle's)."""
        factor = noise_factor(self.matrix, self.cholesky_tries)
        return factor[self.rows] @ self.every_noise / math.sqrt(self.matrix.shape[0])

    def _replace(self, **changes):
        raise TypeError("a RowCoupling is built per step by Shard.row_coupling; not replaced")


class Shard:
    """
    This process's share of a sharded SG-MCMC run, and the collectives that join the shares.

    :param str mode: ``"particles"`` or ``"data"``.
    :param int num_particles: the number ``L`` of particles of the whole run.
    :param group: the process group (default: the world).
    """

    def __init__(self, mode, num_particles, group=None):
        self.mode = mode
        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.num_particles = num_particles
        if mode == "particles":
            per_rank = num_particles // self.world_size
            self.rows = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        else:
            self.rows = slice(0, num_particles)
        #: the global indices of the particles this rank holds
        self.particle_indices = range(num_particles)[self.rows]
        backend = str(dist.get_backend(self.group))
        #: whether a row-sharded step sends the positions while the gradients are computed:
        #: with NCCL, whose collectives run on their own stream. Gloo's run on threads that
        #: take CPU from the gradients: on this project's 2-core machine the overlap slowed
        #: the gradients about as much as it hid (one-off), so gloo sends after them.
        self.overlaps = "nccl" in backend
        #: whether an eager gather goes in pieces (see :meth:`start_gather`)
        self.gathers_in_pieces = "gloo" in backend and "nccl" not in backend

    @property
    def num_local_particles(self) -> int:
        return len(self.particle_indices)

    def __repr__(self):
        return f"Shard(mode={self.mode!r}, rank={self.rank}, world_size={self.world_size})"

    # -- the per-step collectives (traceable) ---------------------------------------------
    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a tensor with one row per particle of the whole run."""
        return tensor[self.rows] if self.mode == "particles" else tensor

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """All ranks' rows, in particle order: ``(L / R, ...)`` -> ``(L, ...)``."""
        return self.wait(self.start_gather(tensor))

    def start_gather(self, tensor: torch.Tensor):
        """
        Start gathering all ranks' rows and return at once (see :meth:`wait`): the
        transfer runs while this rank computes.

        A traced step gathers with one functional collective, part of its graph. An eager
        step on gloo sends its rows in pieces of about :data:`GLOO_PIECE_BYTES`, each an
        asynchronous ``all_gather`` into its rows of the output: gloo moves a large
        tensor at well under the speed of small ones, and gathering the MNIST BNN's
        positions and gradients (2 x 15 MB per rank) took 60-90 ms in one functional
        collective against 18-25 ms in pieces on this project's 2-core machine
        (one-off measurement).
        """
        if not self._in_pieces():
            return _all_gather_single(tensor, 0, self.group)
        tensor = tensor.contiguous()
        rows = tensor.shape[0]
        out = tensor.new_empty((self.world_size * rows,) + tuple(tensor.shape[1:]))
        row_bytes = max(1, tensor[0].numel() * tensor.element_size()) if rows else 1
        per_piece = max(1, GLOO_PIECE_BYTES // row_bytes)
        works = []
        for start in range(0, rows, per_piece):
            stop = min(start + per_piece, rows)
            outputs = [out[r * rows + start : r * rows + stop] for r in range(self.world_size)]
            works.append(
                dist.all_gather(outputs, tensor[start:stop], group=self.group, async_op=True)
            )
        return _Gathering(out, works)

    def _in_pieces(self) -> bool:
        """Whether a gather now goes in pieces: eager, on gloo."""
        return self.gathers_in_pieces and not is_traced()

    def wait(self, pending) -> torch.Tensor:
        """The result of :meth:`start_gather`, once it has arrived."""
        if isinstance(pending, _Gathering):
            for work in pending.works:
                work.wait()
            return pending.out
        return funcol.wait_tensor(pending)

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """The average over ranks (of the data shards' log densities and gradients)."""
        total = funcol.wait_tensor(funcol.all_reduce(tensor, "sum", self.group))
        return total / self.world_size

    def all_true(self, flag: torch.Tensor) -> torch.Tensor:
        """Whether a 0-dim boolean ``flag`` holds on every rank."""
        counts = funcol.all_reduce(flag.to(torch.int32).reshape(1), "sum", self.group)
        return funcol.wait_tensor(counts)[0] == self.world_size

    def shards_rows(self, repulsion) -> bool:
        """Whether a coupled update runs on this rank's rows of the kernel matrix
        (:class:`RowCoupling`): particle sharding with the RBF kernel."""
        return self.mode == "particles" and isinstance(repulsion, RBFKernel)

    def row_coupling(
        self, kernel, z, grad, noise, bandwidth_gradient=True, tries=None, positions=None
    ):
        """
        This rank's :class:`RowCoupling` at its particles ``z`` and gradients ``grad``
        ``(n, D)``: all ranks' positions (``positions``: their gather, started before the
        gradients were computed, see :func:`~.step.step`; else gathered here with the
        gradients), this rank's rows of the squared distances while the gradients travel,
        one ``all_gather`` of those rows (``L^2`` numbers) for the median bandwidth and the
        Cholesky factor. ``noise`` is the whole run's ``(L, D)``.
        """
        if positions is None:
            if self._in_pieces():
                # Both in flight at once, each in pieces: no copy into one tensor first.
                positions, gradients = self.start_gather(z), self.start_gather(grad)
                every_z, every_grad = self.wait(positions), self.wait(gradients)
            else:
                width = z.shape[-1]
                every = self.gather(torch.cat([z, grad], dim=1))
                every_z, every_grad = every[:, :width], every[:, width:]
            sq_rows = kernel.squared_distance_rows(every_z, self.rows)
        else:
            gradients = self.start_gather(grad)
            every_z = self.wait(positions)
            sq_rows = kernel.squared_distance_rows(every_z, self.rows)
            every_grad = self.wait(gradients)
        sq = self.gather(sq_rows)
        h, a, b = kernel.bandwidth_and_pair(sq.detach())
        matrix = torch.exp(-sq / h)
        bandwidth_term = None
        if kernel.bandwidth is None and bandwidth_gradient:
            bandwidth_term = kernel.bandwidth_term(matrix[self.rows], sq_rows, h, a, b, every_z)
        return RowCoupling(
            matrix,
            (2.0 / h) * every_z,
            bandwidth_term,
            self.rows,
            every_grad,
            noise,
            self.gather,
            6 if tries is None else tries,
        )

    def gather_state(self, state, grad, log_density):
        """The whole run's sampler state, gradients and log densities from the ranks' rows,
        in one collective."""
        fields = [f for f in state if f.dim() > 0]
        widths = [f[0].numel() for f in fields] + [grad[0].numel(), 1]
        columns = [f.reshape(f.shape[0], -1) for f in fields] + [grad, log_density.unsqueeze(-1)]
        full = self.gather(torch.cat(columns, dim=1)).split(widths, dim=1)
        rebuilt, parts = [], iter(full[:-2])
        for f in state:
            rebuilt.append(
                next(parts).reshape((self.num_particles,) + f.shape[1:]) if f.dim() > 0 else f
            )
        return type(state)(*rebuilt), full[-2], full[-1].squeeze(-1)

    def local_state(self, state):
        """This rank's rows of a whole-run sampler state (0-dim fields are shared)."""
        return type(state)(*(self.local(f) if f.dim() > 0 else f for f in state))

    def enter(self, state, grad, log_density, noise, coupled):
        """
        The collectives before a step's update (:func:`~.step.transition`): the data
        shards' log densities and gradients averaged; the whole run's state, gradients and
        log densities gathered when the update couples the particles (``coupled``), which
        then runs on every particle; else this rank's rows of the noise of all ``L``.
        """
        if self.mode == "data":
            log_density, grad = self.mean(log_density), self.mean(grad)
        if coupled and self.mode == "particles":
            state, grad, log_density = self.gather_state(state, grad, log_density)
        else:
            noise = self.local(noise)
        return state, grad, log_density, noise

    def leave(self, new_state, grad, log_density, ok, coupled):
        """
        The collectives after a step's update: this rank's rows of what :meth:`enter`
        gathered, and the finiteness flag ``ok`` of every rank. The flag costs no
        collective of its own when the update already ran on every particle's values
        (gathered for repulsion, or the same on every rank for data sharding); independent
        sharded particles exchange it with one ``all_reduce``.
        """
        if self.mode != "particles":
            return new_state, grad, log_density, ok
        if not coupled:
            return new_state, grad, log_density, self.all_true(ok)
        return self.local_state(new_state), self.local(grad), self.local(log_density), ok

    def subsamples(self, potential, device) -> dict:
        """
        The minibatch indices of this step, per subsampled plate: those of the single-process
        run (``"particles"``), or this rank's chunk of the ``R b`` global minibatch
        (``"data"``). Every rank draws them from the shared random stream in the same order.
        """
        if self.mode == "particles":
            return potential.draw_subsamples(device)
        r, b = self.rank, None
        chunks = {}
        for name, (size, b) in potential.subsample_sizes.items():
            indices = torch.randperm(size, device=device)[: b * self.world_size]
            chunks[name] = indices[r * b : (r + 1) * b]
        return chunks

    # -- set-up checks (eager, once per run) ----------------------------------------------
    def check_consistent(self, layout, initial_particles, data_shapes):
        """
        Compare what every rank set up: the model's site layout and data shapes, and the
        initial particles (the same seed on every rank gives the same ones). Every rank
        raises the same ValueError on a mismatch, so none waits for the others.
        """
        mine = {
            "layout": _layout_digest(layout),
            "data": _layout_digest(data_shapes),
            "particles": _tensor_digest(initial_particles),
        }
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.group)
        for key, what in (
            ("layout", "the model's latent sites (the ranks run different models)"),
            ("data", "the shapes of the model's arguments (different data)"),
            (
                "particles",
                "their initial particles: seed every rank the same (pyro.set_rng_seed(seed) "
                "before the run), and give every rank the same init_strategy",
            ),
        ):
            ranks = [r for r, other in enumerate(everyone) if other[key] != everyone[0][key]]
            if ranks:
                raise ValueError(
                    f"shard={self.mode!r}: rank(s) {ranks} disagree with rank 0 on {what}. "
                    "Every rank of a sharded run must run the same model on the same data "
                    "from the same seed."
                )

    def gather_object(self, obj) -> list:
        """Every rank's ``obj`` (pickled), on every rank."""
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, obj, group=self.group)
        return everyone


def resolve_shard(shard, num_particles, device, potential, group=None):
    """
    The :class:`Shard` a kernel set up on ``device`` runs with, or ``None`` for a
    single-process run; a ValueError says what to change when ``shard`` cannot apply.
    """
    check_choice(shard, "shard", SHARD_MODES[:-1], allow_none=True)
    if shard is None:
        return None
    initialized = dist.is_available() and dist.is_initialized()
    if not initialized:
        if shard == "auto":
            return None
        raise ValueError(
            f"shard={shard!r} needs a torch.distributed process group: launch the script with "
            "torchrun and call torch.distributed.init_process_group() before the run, or pass "
            "shard=None"
        )
    world_size = dist.get_world_size(group)
    if world_size == 1 and shard == "auto":
        return None
    backend = str(dist.get_backend(group))
    wanted = BACKENDS.get(device.type)
    # A backend string such as "cpu:gloo,cuda:nccl" lists one backend per device type.
    if wanted is None or wanted not in backend:
        raise ValueError(
            f"the process group's backend is {backend!r}, and particles on a {device.type} "
            f"device need {wanted or 'gloo (cpu) or nccl (cuda)'!r}: initialise the group with "
            f"torch.distributed.init_process_group({wanted or 'gloo'!r}), or pass shard=None"
        )
    mode = "particles" if shard == "auto" else shard
    if mode == "particles" and num_particles % world_size:
        raise ValueError(
            f"num_particles={num_particles} is not divisible by the world size {world_size}: "
            "each rank holds num_particles / world_size particles. Choose a multiple of "
            f"{world_size}, or shard='data' (every rank holds all particles and a share of "
            "the minibatch)"
        )
    if mode == "data":
        plates = potential.subsample_sizes
        if len(plates) != 1:
            raise ValueError(
                "shard='data' splits the minibatch of one subsampled plate between the ranks, "
                f"and the model has {len(plates)} ({sorted(plates)}): write its data plate "
                "as pyro.plate(name, N, subsample_size=b), b the per-rank minibatch size"
            )
        ((name, (size, per_rank)),) = plates.items()
        if per_rank * world_size > size:
            raise ValueError(
                f"shard='data': the plate {name!r} of size {size} cannot give {world_size} "
                f"ranks subsample_size={per_rank} distinct indices each; its subsample_size "
                "is the per-rank minibatch, so take at most "
                f"{size // world_size}"
            )
    return Shard(mode, num_particles, group)
