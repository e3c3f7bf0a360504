"""SIGTERM and SIGINT become a request to checkpoint and stop, agreed on by every rank.

SLURM and Kubernetes send SIGTERM before they kill a job; torchrun forwards it to its workers; a
user presses Ctrl-C (SIGINT). The signal may reach one rank only, and a rank that left the loop on
its own would leave the others waiting forever in the next all-reduce. So the handler only notes
the signal, and at every step boundary the ranks take the maximum of their notes: all of them stop
at the same step, save one checkpoint and exit with 128 + the signal number.
"""
from __future__ import annotations

import atexit
import multiprocessing
import signal
import sys

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(Exception):
    """Raised after the checkpoint is written; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int, step: int, checkpoint: str) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint {checkpoint}; "
                         f"run the same command again to resume from it")


class StopSignal:
    """Installs the handlers on creation; `agreed()` is the collective check at a step boundary."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group  # a gloo group: the check stays on the CPU even when training uses NCCL
        self.received = 0
        self.previous = {signum: signal.signal(signum, self.handle) for signum in SIGNALS}

    def handle(self, signum: int, frame: object) -> None:
        self.received = self.received or signum
        print(f"received {signal.Signals(signum).name}: checkpointing at the next step boundary", file=sys.stderr)
        if signum == signal.SIGINT:
            # A second Ctrl-C is the user insisting: the default handler raises KeyboardInterrupt. A
            # second SIGTERM is not: SLURM signals every process of a step, torchrun forwards it too.
            signal.signal(signum, self.previous[signum])

    def agreed(self) -> int:
        """The signal any rank received (0 if none). Every rank must call this at the same step."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.received
        flag = torch.tensor([self.received], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def ignore_stop_signals(worker_id: int) -> None:
    """`worker_init_fn` for data-loader workers. Ctrl-C reaches the whole process group and SLURM
    signals every process of a job step; a worker killed by it would crash the main process before
    it could checkpoint. The main process stops its workers (see `_kill_workers_at_exit`)."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@atexit.register  # after multiprocessing's own handler, so it runs before it
def _kill_workers_at_exit() -> None:
    """multiprocessing's exit handler terminates its children with SIGTERM, which the workers ignore,
    and then waits for them: a process leaving on an error would wait forever."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the workers' deaths are expected now, not errors
    for child in multiprocessing.active_children():
        child.kill()
