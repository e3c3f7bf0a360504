"""Distributed setup from torchrun's environment, with one process as the same code path.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE (and LOCAL_WORLD_SIZE); without them this is a single
process and no process group is created. Outside torchrun those variables are refused (a stale
WORLD_SIZE left in a shell would make a plain `python train.py` wait for peers that never come), and
the rendezvous at start-up is bounded: it ends with one line naming what it waited for. So are the
collectives after it: a rank that stops answering (SIGSTOPped, stuck on a network file system) ends the
others' wait after COLLECTIVE_TIMEOUT (was torch's 30 minutes, silently), with a line naming the rank.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from utils.host_memory import keep_freed_memory


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    # gloo, for small host-side messages (stop flags, objects): with NCCL each would need a CUDA
    # tensor and a host-device sync. None: the default group (gloo already, or one process).
    cpu_group: dist.ProcessGroup | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# torchrun's own mark on every worker it starts (torch 2.x; with RANK, LOCAL_RANK, GROUP_RANK, ...).
# Another launcher that sets RANK and WORLD_SIZE is not supported: there is one way to launch.
LAUNCHED_BY_TORCHRUN = "TORCHELASTIC_RUN_ID"
# How long a process waits at start-up for the others. torchrun starts every worker of every node at
# once, after its own rendezvous of the nodes; this covers the imports and config reading between.
JOIN_TIMEOUT = timedelta(minutes=5)
# How long a collective waits for the other processes. Longer than anything one rank does while the others
# wait (rank 0 writing a checkpoint, the slowest shard of a validation, a label index scanned at start-up);
# a slower file system can raise it (minutes, a number) with this environment variable.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
COLLECTIVE_TIMEOUT_VARIABLE = "CRNN_COLLECTIVE_TIMEOUT_MINUTES"
# The rendezvous store, kept to find out, after a collective timed out, which ranks are still there.
_store: dist.Store | None = None


def read_env() -> tuple[int, int, int, int]:
    """(rank, local_rank, world_size, local_world_size) from torchrun's variables, or one process.

    Without torchrun, these variables in the environment are what another job left in the shell: a
    world size above 1 would wait for processes that were never started, a rank above 0 would run
    silently without a log. Both are refused, naming the variable."""
    one_process = {"RANK": 0, "LOCAL_RANK": 0, "WORLD_SIZE": 1}
    values = {name: env_int(name, default) for name, default in one_process.items()}
    values["LOCAL_WORLD_SIZE"] = env_int("LOCAL_WORLD_SIZE", values["WORLD_SIZE"])
    if LAUNCHED_BY_TORCHRUN not in os.environ:
        for name, value in values.items():
            if value != one_process.get(name, 1):
                raise ValueError(
                    f"{name}={value} is set in the environment, but this process was not started by "
                    f"torchrun (${LAUNCHED_BY_TORCHRUN} is not set): a variable left from another job, or "
                    f"another launcher. Unset {name} to run one process, or launch with torchrun "
                    f"--nproc_per_node=N"
                )
    if not 0 <= values["RANK"] < values["WORLD_SIZE"]:
        raise ValueError(f"RANK={values['RANK']} is not below WORLD_SIZE={values['WORLD_SIZE']}: launch with torchrun")
    return values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"], values["LOCAL_WORLD_SIZE"]


def env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer; unset it or give a number") from None


def pick_device(local_rank: int, local_world_size: int, device_ids: list[int]) -> torch.device:
    """The device of this process: decided here once, from CUDA's presence and `device_ids`."""
    if not torch.cuda.is_available():
        if device_ids:
            raise ValueError(
                f"device_ids={device_ids} is set but CUDA is not available; set device_ids=[] to run on the CPU"
            )
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if device_ids:
        if len(device_ids) < local_world_size:
            raise ValueError(
                f"device_ids={device_ids} lists {len(device_ids)} GPUs for {local_world_size} processes on this node;"
                " list one GPU per process (--nproc_per_node)"
            )
        missing = [i for i in device_ids if not 0 <= i < count]
        if missing:
            raise ValueError(
                f"device_ids={device_ids}: GPU(s) {missing} do not exist; this node has {count} (0..{count - 1})"
            )
        return torch.device("cuda", device_ids[local_rank])
    if local_rank >= count:
        raise ValueError(
            f"local rank {local_rank} needs GPU {local_rank} but this node has {count}; lower --nproc_per_node"
        )
    return torch.device("cuda", local_rank)


def setup_distributed(device_ids: list[int], threads: int = 0, join_timeout: timedelta = JOIN_TIMEOUT) -> DistEnv:
    """Bind this process to its device, set its CPU threads (on the CPU, keep its freed memory), then join
    the process group (waiting at most `join_timeout` for the other processes)."""
    rank, local_rank, world_size, local_world_size = read_env()
    device = pick_device(local_rank, local_world_size, device_ids)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init_process_group, so NCCL uses this GPU
        # Training images all have one shape: cuDNN's per-shape search for the fastest convolution
        # algorithms pays once. (Evaluation batched by width adds a handful of shapes.)
        torch.backends.cudnn.benchmark = True
    torch.set_num_threads(threads_per_process(threads, local_world_size))
    if device.type == "cpu":
        keep_freed_memory()  # the tensors live in host memory: reuse it rather than fault it in every step
    cpu_group = None
    if world_size > 1:
        global _store
        timeout = collective_timeout()
        backend = process_group_backend(device, device_ids, local_world_size)
        _store = join_store(rank, world_size, join_timeout, timeout)
        dist.init_process_group(
            backend=backend,
            store=_store,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
        if backend != "gloo":
            cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device, cpu_group=cpu_group)


def process_group_backend(device: torch.device, device_ids: list[int], local_world_size: int) -> str:
    """NCCL between GPUs; gloo on CPUs, and between processes that share a GPU (device_ids: [0, 0]), which
    NCCL refuses ("Duplicate GPU detected"). Gloo carries CUDA tensors too, through host memory: slower,
    for tests and debugging on one GPU, not for training."""
    if device.type != "cuda":
        return "gloo"
    shares_a_gpu = len(set(device_ids[:local_world_size])) < local_world_size if device_ids else False
    return "gloo" if shares_a_gpu else "nccl"


def collective_timeout() -> timedelta:
    """COLLECTIVE_TIMEOUT, or the minutes given in $CRNN_COLLECTIVE_TIMEOUT_MINUTES."""
    text = os.environ.get(COLLECTIVE_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return COLLECTIVE_TIMEOUT
    try:
        minutes = float(text)
    except ValueError:
        minutes = 0.0
    if not 0 < minutes < 7 * 24 * 60:
        raise ValueError(
            f"environment variable {COLLECTIVE_TIMEOUT_VARIABLE}={text!r}: give the minutes a collective may "
            f"wait for the other processes (a number above 0; unset: {COLLECTIVE_TIMEOUT.total_seconds() / 60:g})"
        )
    return timedelta(minutes=minutes)


def join_store(
    rank: int, world_size: int, timeout: timedelta, collective: timedelta = COLLECTIVE_TIMEOUT
) -> dist.Store:
    """The rendezvous store, once every process of the run has checked in; at most `timeout` of waiting.

    torch's own rendezvous waits 30 minutes inside C++, where neither SIGTERM nor Ctrl-C is acted on.
    Here the waiting is a loop in Python: a signal stops it at once (utils.preemption), and the
    deadline ends it with one line.
    """
    address, port = rendezvous_address()
    deadline = time.monotonic() + timeout.total_seconds()
    # torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE); otherwise rank 0 does.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if rank == 0 and not agent_store:
        try:
            store = dist.TCPStore(address, port, world_size, is_master=True, wait_for_workers=False)
        except RuntimeError as error:
            raise ValueError(
                f"MASTER_PORT={port}: rank 0 cannot host the rendezvous there ({error}); "
                f"pick a free port (torchrun --master_port)"
            ) from None
    else:
        wait_until_reachable(address, port, deadline, timeout)
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timedelta(seconds=60))
    if agent_store:
        # torchrun's agent keeps one store across restarts, and torch 2.14 does not separate the attempts'
        # keys in it: a restarted rank that starts a little late makes its peers read the address it had
        # in the attempt that died ("Connection refused"). Prefixed keys give every attempt its own.
        store = dist.PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    wait_for_every_process(store, world_size, deadline, timeout, f"{address}:{port}")
    store.set_timeout(collective)  # from here on, the collectives' timeout
    return store


def rendezvous_address() -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT, which torchrun sets."""
    address, port = os.environ.get("MASTER_ADDR", ""), env_int("MASTER_PORT", 0)
    if not address or not 0 < port < 65536:
        raise ValueError(
            f"MASTER_ADDR={address!r} and MASTER_PORT={port or ''!r} must name the rendezvous of the "
            f"{os.environ.get('WORLD_SIZE')} processes; launch with torchrun, which sets both"
        )
    return address, port


def wait_until_reachable(address: str, port: int, deadline: float, timeout: timedelta) -> None:
    """Wait for the store's host to listen. A plain socket, not TCPStore: its failed attempts each print
    a C++ stack trace."""
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError as error:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"waited {timeout.total_seconds():g} s for the rendezvous at MASTER_ADDR:"
                    f"MASTER_PORT={address}:{port} ({error.strerror or error}): rank 0 never started, "
                    f"or the address is wrong or unreachable from this node"
                ) from None
            time.sleep(0.5)


def wait_for_every_process(store: dist.Store, world_size: int, deadline: float, timeout: timedelta, where: str) -> None:
    """Check in, then wait until all `world_size` processes have."""
    joined = store.add("processes-joined", 1)
    while joined < world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {timeout.total_seconds():g} s at {where} for the {world_size} processes of the "
                f"run (WORLD_SIZE); {joined} joined. Another process failed before joining (see its "
                f"error above) or never started: check each node's log"
            )
        time.sleep(0.2)
        joined = store.add("processes-joined", 0)


def threads_per_process(requested: int, local_world_size: int) -> int:
    # Processes on one node share its cores; oversubscribing them slows every step several-fold.
    if requested > 0:
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return max(1, env_int("OMP_NUM_THREADS", 1))
    return max(1, usable_cores() // local_world_size)


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask (a container's, a job scheduler's or
    taskset's share of the machine), where the system keeps one."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def loader_workers(cores: int, processes: int, device_type: str) -> int:
    """data.num_workers `auto`: the loader workers per training process that keep its device fed. On a GPU,
    the process's share of the `cores` it may use among the `processes` on its node, less one for the
    training process itself, at least 1: decoding and augmenting on the CPU are what a GPU waits on. On the
    CPU, 0: the training processes already fill the cores, and workers would only take turns with them
    (configs/crnn.yaml's data.num_workers)."""
    if device_type != "cuda":
        return 0
    return max(1, cores // processes - 1)


@contextlib.contextmanager
def answered(what: str) -> Any:
    """A collective (`what`) whose timeout is one line naming the ranks that did not answer, not gloo's
    `Timed out waiting 600000ms for recv operation to complete`. Free when nothing times out."""
    try:
        yield
    except RuntimeError as error:
        said = str(error).lower()
        if not dist.is_initialized() or ("timed out" not in said and "timeout" not in said):
            raise
        raise TimeoutError(not_answered(what)) from error


def not_answered(what: str) -> str:
    """Which ranks did not answer: each rank whose collective timed out checks in on the rendezvous
    store and waits a little for the others to; those that never do are stopped or stuck."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    seconds = collective_timeout().total_seconds()
    minutes = f"{seconds / 60:g} minutes" if seconds >= 60 else f"{seconds:g} s"
    missing: list[int] | None = None
    with contextlib.suppress(Exception):  # the store's host (rank 0, or torchrun's agent) may be the one stuck
        assert _store is not None
        _store.set_timeout(timedelta(seconds=10))
        _store.set(f"timed-out/{rank}", what)
        keys = [f"timed-out/{other}" for other in range(world_size)]
        deadline = time.monotonic() + 10
        while True:
            absent = [other for other, key in enumerate(keys) if not _store.check([key])]
            if not absent or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        missing = absent
    if missing:
        ranks = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {', '.join(map(str, missing))}"
        who = f"{ranks} did not answer"
    elif missing == []:
        return (
            f"rank {rank}, in {what}: every rank waited {minutes} in a collective, none answered by another: "
            f"they are in different collectives (a rank took another branch, a bug); run with CRNN_TRACEBACK=1 "
            f"to see where each one waits"
        )
    else:
        who = "the rendezvous store (rank 0, or torchrun's agent) did not answer either, so another rank did not"
    return (
        f"rank {rank}, in {what}: {who} for {minutes}: a process stopped or stuck (on a network file "
        f"system?), or its node is unreachable; check that rank's log and its file systems. If that rank was "
        f"only slow, raise ${COLLECTIVE_TIMEOUT_VARIABLE} (now {minutes})"
    )


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum a tensor over all processes (a no-op in one process); returned on the tensor's device."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    # NCCL reduces CUDA tensors only; gloo is given CPU tensors (also where processes share a GPU).
    on_wire = tensor.cuda() if dist.get_backend() == "nccl" else tensor.cpu()
    with answered("a sum over the processes"):
        dist.all_reduce(on_wire, op=dist.ReduceOp.SUM)
    return on_wire.to(tensor.device)


def broadcast_object(value: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Rank 0's `value` on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    holder = [value]
    with answered("a broadcast from rank 0"):
        dist.broadcast_object_list(holder, src=0, group=group)
    return holder[0]


def gather_objects(value: Any, group: dist.ProcessGroup | None = None) -> list[Any] | None:
    """Every rank's `value`, in rank order, on rank 0; None on the other ranks."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    with answered("a gather to rank 0"):
        dist.gather_object(value, gathered, dst=0, group=group)
    return gathered


def broadcast_buffers(module: nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm running statistics) to every rank.

    DDP broadcasts them at the start of each forward, so after the last training step every rank
    holds the statistics of its own last batch. Evaluating then would score each shard with a
    slightly different model, and not the one rank 0 saves.
    """
    if dist.is_available() and dist.is_initialized():
        with answered("a broadcast of the model's buffers"):
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        with answered("a barrier"):
            dist.barrier()
