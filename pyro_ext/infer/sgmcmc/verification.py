"""
Deferred verification of compiled steps: snapshot and rewind.

On an accelerator, reading a compiled step's finiteness flag synchronises with the device,
so :class:`~.kernels.SGMCMCKernel` reads the flags of several steps at once
(``divergence_check_every``). Before the steps it has not read, it keeps a
:class:`Snapshot` of the last verified state and of the random number generators; when a
read finds a non-finite step, :meth:`DeferredVerification.check` restores the generators
and hands back the snapshot, from which the kernel replays eagerly up to and including
the first bad step, drawing the same minibatches and noise.
"""

from typing import NamedTuple

import torch


class Snapshot(NamedTuple):
    """The last verified step count and sampler state, and the generators' states then."""

    step: int
    state: tuple
    cpu_rng: torch.Tensor
    cuda_rng: list | None


class DeferredVerification:
    """The unread finiteness flags of a chain's compiled steps and the snapshot before them."""

    def __init__(self):
        self.reset()

    def reset(self):
        """Forget the flags and the snapshot (a new run, or a loaded state)."""
        self.pending = []
        self.snapshot = None
        #: steps before this count run eagerly (the replay after a rewind)
        self.eager_until = 0

    @property
    def unverified(self) -> int:
        """The number of steps whose flags were not read yet."""
        return len(self.pending)

    def record(self, ok: torch.Tensor) -> None:
        """Keep the (unread) 0-dim finiteness flag of one more step."""
        self.pending.append(ok)

    def take_snapshot(self, step: int, state) -> None:
        """Remember ``(step, state)`` as verified, with the generators' states."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.snapshot = Snapshot(step, state, torch.get_rng_state(), cuda)

    def check(self) -> Snapshot | None:
        """
        Read the pending flags (one device synchronisation). ``None`` when they were all
        finite; otherwise the generators are restored to the snapshot's, the steps up to
        the first non-finite one are to run eagerly (:attr:`eager_until`), and the
        snapshot to rewind the chain to is returned.
        """
        if not self.pending:
            return None
        flags = torch.stack(self.pending)
        self.pending = []
        if bool(flags.all()):
            return None
        snapshot = self.snapshot
        torch.set_rng_state(snapshot.cpu_rng)
        if snapshot.cuda_rng is not None:
            torch.cuda.set_rng_state_all(snapshot.cuda_rng)
        self.eager_until = snapshot.step + int((~flags).nonzero()[0]) + 1
        return snapshot
