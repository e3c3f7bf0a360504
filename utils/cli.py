"""The one place where expected failures of every command become a one-line error, and a stop signal
a one-line stop.

Bad input (a config value, a missing or unreadable file, a folder that is not an LMDB, a full or
read-only disk) is not a bug: its message names the file, key or option and what to do, and a
traceback would bury it. Anything else is a bug and keeps its traceback. CRNN_TRACEBACK=1 in the
environment shows the traceback of expected failures too.

Ctrl-C (SIGINT) and SIGTERM (`timeout`, SLURM, Kubernetes, `kill`) are neither: the command stops with
`stopped by SIGINT ...` and the shell's 128 + signal number (130, 143). The signal becomes an exception
(`Stopped`), so `finally` blocks and the writers' clean-up (a staging folder, a temporary file) run.
train.py replaces the handlers while it runs to checkpoint first (utils/preemption.py).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
from collections.abc import Callable
from types import FrameType

import lmdb

# What to do about the operating system's refusals, by errno.
OS_ADVICE = {
    errno.ENOSPC: "the disk is full: free space or write elsewhere (files already in place were left intact)",
    errno.EDQUOT: "the disk quota is exhausted: free space or write elsewhere "
    "(files already in place were left intact)",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EACCES: "no permission: fix the permissions or use another path",
    errno.EPERM: "not permitted: fix the permissions or use another path",
    errno.EISDIR: "it is a folder: give a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "something else is already there: remove it or use another path",
}


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt: no `except Exception` meant for a bad
    file may take it for one. `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int, message: str | None = None) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message or f"stopped by {signal.Signals(signum).name}; no file was left half-written")


class StopHandlers:
    """Turns the first SIGINT or SIGTERM into `Stopped` and remembers it. A second Ctrl-C is the user
    insisting: it raises again, also in the middle of a clean-up. A second SIGTERM is not (SLURM signals
    every process of a job, torchrun forwards it too): it is ignored, so the clean-up finishes."""

    def __init__(self) -> None:
        self.received = 0
        self.main_process = os.getpid()
        self.previous = {signum: signal.signal(signum, self.handle) for signum in STOP_SIGNALS}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.main_process:
            leave_stop_to_the_main_process(signum)
            return
        if self.received and signum == signal.SIGTERM:
            return
        self.received = self.received or signum
        raise Stopped(self.received)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def leave_stop_to_the_main_process(signum: int) -> None:
    """In a worker forked from the command (a rendering pool's, a data loader's before its worker_init_fn
    runs), which inherited the handler: a traceback from each would bury the command's one line. Ctrl-C
    reaches every process of the terminal's foreground group, and the main process, stopping, ends its
    workers: ignored. SIGTERM is how multiprocessing's Pool.terminate() ends them: exit quietly."""
    if signum == signal.SIGTERM:
        os._exit(128 + signum)


def default_stop_signals_in_worker() -> None:
    """For a multiprocessing Pool's initializer: the command's stop handlers, inherited by the fork, are
    dropped. Pool.terminate() ends its workers with SIGTERM, which must kill at once: a handler in Python
    runs only between bytecodes, so a worker the signal reached just before it blocked on the task queue's
    lock (held by a sibling the same SIGTERM had just killed) would wait there forever, and the command
    with it. Ctrl-C is the main process's to handle: ignored here."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def describe(error: BaseException) -> str:
    """The one line an expected failure is reported with."""
    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError) and error.errno in OS_ADVICE:
        where = error.filename or ""
        return f"{where}{': ' if where else ''}{error.strerror or error}; {OS_ADVICE[error.errno]}"
    if isinstance(error, lmdb.Error):
        return f"LMDB: {error}"
    return str(error)


def run(main: Callable[[], int | None], expected: tuple[type[BaseException], ...] = ()) -> None:
    """Run a command's `main` and exit with its code, turning expected failures into `error: ...` on
    stderr and exit code 1, and a stop signal into `stopped by ...` and 128 + its number. `expected`
    adds a command's own exception types."""
    stops = StopHandlers()
    try:
        code = main()
    except Stopped as stopped:
        exit_stopped(stopped)
    except BaseException as error:
        # A signal can come out as another exception: a C extension that was importing turns it into
        # an ImportError, a library wraps it. Whatever was raised after it, the signal is the cause.
        if stops.received:
            exit_stopped(Stopped(stops.received))
        if isinstance(error, BrokenPipeError) and stdout_reader_gone():
            exit_reader_gone()
        if not isinstance(error, (ValueError, OSError, lmdb.Error, *expected)):  # ConfigError is a ValueError
            raise
        if os.environ.get("CRNN_TRACEBACK") == "1":
            raise
        sys.exit(f"error: {describe(error)}")
    finally:
        stops.restore()
    if stops.received:  # swallowed on the way (an `except BaseException` that went on): still a stop
        exit_stopped(Stopped(stops.received))
    sys.exit(code or 0)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (`predict.py ... | head`)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):  # no stdout, or not a file descriptor
        return False


def exit_reader_gone() -> None:
    """End quietly, as a command killed by SIGPIPE does (`yes | head`): the reader has what it wanted."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit would fail again
    sys.exit(128 + signal.SIGPIPE)


def exit_stopped(stopped: Stopped) -> None:
    print(stopped, file=sys.stderr)
    if os.environ.get("CRNN_TRACEBACK") != "1":
        # What follows is teardown that the stop cut into: an object half built when the signal came, a
        # data loader whose workers the signal ended (torch's __del__ then reports both). Expected now.
        sys.unraisablehook = ignore_teardown_error
    sys.exit(stopped.exit_code)


def ignore_teardown_error(unraisable: object) -> None:
    pass
