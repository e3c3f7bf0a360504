"""Distributed setup from torchrun's environment, with one process as the same code path.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE (and LOCAL_WORLD_SIZE); without them this is a single
process and no process group is created.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.constants import default_pg_timeout


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


def read_env() -> tuple[int, int, int, int]:
    """(rank, local_rank, world_size, local_world_size) from torchrun's variables, or one process."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return rank, local_rank, world_size, local_world_size


def pick_device(local_rank: int, local_world_size: int, device_ids: list[int]) -> torch.device:
    """The device of this process: decided here once, from CUDA's presence and `device_ids`."""
    if not torch.cuda.is_available():
        if device_ids:
            raise ValueError(f"device_ids={device_ids} is set but CUDA is not available; set device_ids=[] to run on the CPU")
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
            raise ValueError(f"device_ids={device_ids}: GPU(s) {missing} do not exist; this node has {count} (0..{count - 1})")
        return torch.device("cuda", device_ids[local_rank])
    if local_rank >= count:
        raise ValueError(f"local rank {local_rank} needs GPU {local_rank} but this node has {count}; lower --nproc_per_node")
    return torch.device("cuda", local_rank)


def setup_distributed(device_ids: list[int], threads: int = 0) -> DistEnv:
    """Bind this process to its device, set its CPU threads, then join the process group."""
    rank, local_rank, world_size, local_world_size = read_env()
    device = pick_device(local_rank, local_world_size, device_ids)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init_process_group, so NCCL uses this GPU
        # Training images all have one shape: cuDNN's per-shape search for the fastest convolution
        # algorithms pays once. (Evaluation batched by width adds a handful of shapes.)
        torch.backends.cudnn.benchmark = True
    torch.set_num_threads(threads_per_process(threads, local_world_size))
    cpu_group = None
    if world_size > 1:
        backend = process_group_backend(device, device_ids, local_world_size)
        dist.init_process_group(backend=backend, store=attempt_store(world_size), rank=rank, world_size=world_size,
                                device_id=device if backend == "nccl" else None)
        if backend != "gloo":
            cpu_group = dist.new_group(backend="gloo")
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device, cpu_group=cpu_group)


def process_group_backend(device: torch.device, device_ids: list[int], local_world_size: int) -> str:
    """NCCL between GPUs; gloo on CPUs, and between processes that share a GPU (device_ids: [0, 0]), which
    NCCL refuses ("Duplicate GPU detected"). Gloo carries CUDA tensors too, through host memory: slower,
    for tests and debugging on one GPU, not for training."""
    if device.type != "cuda":
        return "gloo"
    shares_a_gpu = len(set(device_ids[:local_world_size])) < local_world_size if device_ids else False
    return "gloo" if shares_a_gpu else "nccl"


def attempt_store(world_size: int) -> dist.Store | None:
    """The rendezvous store of this torchrun attempt, or None to let torch open it from the environment.

    torchrun's agent keeps one store across restarts, and torch 2.14 does not separate the attempts'
    keys in it: a restarted rank that starts a little late makes its peers read the address it had
    in the attempt that died, and the process group fails with "Connection refused". Prefixing the
    keys with the restart count gives every attempt its own.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=default_pg_timeout)
    return dist.PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def threads_per_process(requested: int, local_world_size: int) -> int:
    # Processes on one node share its cores; oversubscribing them slows every step several-fold.
    if requested > 0:
        return requested
    if "OMP_NUM_THREADS" in os.environ:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, (os.cpu_count() or 1) // local_world_size)


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum a tensor over all processes (a no-op in one process); returned on the tensor's device."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    # NCCL reduces CUDA tensors only; gloo is given CPU tensors (also where processes share a GPU).
    on_wire = tensor.cuda() if dist.get_backend() == "nccl" else tensor.cpu()
    dist.all_reduce(on_wire, op=dist.ReduceOp.SUM)
    return on_wire.to(tensor.device)


def broadcast_object(value: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Rank 0's `value` on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0, group=group)
    return holder[0]


def gather_objects(value: Any, group: dist.ProcessGroup | None = None) -> list[Any] | None:
    """Every rank's `value`, in rank order, on rank 0; None on the other ranks."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, gathered, dst=0, group=group)
    return gathered


def broadcast_buffers(module: nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm running statistics) to every rank.

    DDP broadcasts them at the start of each forward, so after the last training step every rank
    holds the statistics of its own last batch. Evaluating then would score each shard with a
    slightly different model, and not the one rank 0 saves.
    """
    if dist.is_available() and dist.is_initialized():
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()

