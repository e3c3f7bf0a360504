"""SIGTERM and SIGINT become a request to checkpoint and stop, agreed on by every rank.

SLURM and Kubernetes send SIGTERM before they kill a job; torchrun forwards it to its workers; a
user presses Ctrl-C (SIGINT). The signal may reach one rank only, and a rank that left the loop on
its own would leave the others waiting forever in the next all-reduce. So, once the loop runs, the
handler only notes the signal, and at every step boundary the ranks take the maximum of their notes:
all of them stop at the same step, save one checkpoint and exit with 128 + the signal number.

Before the loop (reading labels, loading a checkpoint) there is no step boundary to wait for and
nothing to save: a signal stops the process at once.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import sys

import torch
import torch.distributed as dist

from utils.cli import Stopped

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Set by torchrun's agent in its workers' environment.
FORWARDED_BY_LAUNCHER = "TORCHELASTIC_RUN_ID"


class StopRequested(Stopped):
    """Raised after the checkpoint is written (or before training started, with nothing to save);
    utils/cli.run reports it and exits with the shell's 128 + signal number."""

    def __init__(self, signum: int, step: int | None = None, checkpoint: str | None = None) -> None:
        self.step, self.checkpoint = step, checkpoint
        name = signal.Signals(signum).name
        super().__init__(
            signum,
            f"stopped by {name} at step {step}; checkpoint {checkpoint}; run the same command "
            f"again to resume from it"
            if checkpoint
            else f"stopped by {name} before training started; nothing was saved",
        )


class StopSignal:
    """Installs the handlers on creation: until `defer()` a signal stops the process at once (raises
    StopRequested); after it, `agreed()` is the collective check at a step boundary."""

    def __init__(self) -> None:
        self.group: dist.ProcessGroup | None = None  # gloo: the check stays on the CPU even when training uses NCCL
        self.received = 0
        self.deferred = False
        self.previous = {signum: signal.signal(signum, self.handle) for signum in SIGNALS}

    def defer(self, group: dist.ProcessGroup | None) -> None:
        """The loop starts: from now on a signal is noted and acted on at the next step boundary."""
        self.group, self.deferred = group, True

    def handle(self, signum: int, frame: object) -> None:
        if not self.deferred:
            raise StopRequested(signum)
        self.received = self.received or signum
        print(f"received {signal.Signals(signum).name}: checkpointing at the next step boundary", file=sys.stderr)
        if signum == signal.SIGINT and FORWARDED_BY_LAUNCHER not in os.environ:
            # A second Ctrl-C is the user insisting: the handler before this one (utils/cli.py's) stops
            # at once. A second SIGTERM is not: SLURM signals every process of a step, torchrun forwards
            # it too. Nor is a second SIGINT under torchrun: Ctrl-C reaches torchrun and its workers
            # alike, and torchrun forwards its own to them (its --shutdown-timeout, 30 s, then kills them).
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
    it could checkpoint. The main process kills its workers when it exits (`kill_workers_at_exit`)."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def kill_workers_at_exit() -> None:
    """Kill this process's multiprocessing children when it exits; call it where workers that
    ignore SIGTERM are started. multiprocessing's own exit handler terminates its children with
    SIGTERM, which those workers ignore, and then waits for them: a process leaving on an error
    would wait forever. Registered (again) last, so it runs first."""
    atexit.unregister(_kill_children)
    atexit.register(_kill_children)


def _kill_children() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the workers' deaths are expected now, not errors
    for child in multiprocessing.active_children():
        child.kill()
