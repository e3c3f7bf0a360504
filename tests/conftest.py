"""Shared fixtures and helpers: small real LMDBs made by the project's own generator, a small trained run and
its checkpoint, the small-run recipe (SMALL_RUN), the torchrun launcher, and how a test runs a command."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def run_env() -> dict[str, str]:
    """Environment for child processes: one thread each, so two of them share this 2-core machine. The
    checkout comes first on their path, and what the path held stays after it: on a GPU image that lacks a
    package, tools/gpu_check.sh puts the one it installed from a wheel there."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": path}


# The small run every test of train.py starts from: a small LSTM, loading in the process, fp32, no TensorBoard.
# A test that needs something else says so after it, e.g. [*SMALL_RUN, "train.max_steps=40"]: the last value wins.
SMALL_RUN = (
    "model.hidden_size=32",
    "data.num_workers=0",
    "train.precision=fp32",
    "train.batch_size=8",
    "train.tensorboard=false",
)
# The launcher, spelled once: torchrun as `python -m`, so that it runs with this interpreter.
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")


def torchrun(processes: int = 2, *options: str) -> tuple[str, ...]:
    """The launcher of `processes` processes on this machine alone (--standalone), with `options`."""
    return (*TORCHRUN, "--standalone", f"--nproc_per_node={processes}", *options)


TORCHRUN_TWO = torchrun(2)
# torchrun stops the other ranks as soon as it sees one exit with an error, and it looks every 0.1 s: a test
# that every rank reports the same start-up error on its own gives the slower rank 5 s to reach it.
TORCHRUN_TWO_UNTIL_EACH_FAILS = torchrun(2, "--monitor-interval=5")


def run_command(
    *command: object,
    cwd: Path | None = REPO,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """`command` (each part as text) run to its end from `cwd` (None: this process's folder), in run_env() with
    `env` over it, its stdout and stderr captured as text; its result, whatever the exit code unless `check`,
    which asserts that it succeeded and shows the ends of its output if not."""
    parts = [str(part) for part in command]
    result = subprocess.run(
        parts, cwd=cwd, env={**run_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert result.returncode == 0, f"{shlex.join(parts)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def start_command(
    *command: object, env: dict[str, str] | None = None, stdout: int = subprocess.PIPE, stderr: int = subprocess.PIPE
) -> subprocess.Popen:
    """`command` started from the checkout in run_env() with `env` over it, its output in text pipes, in a session
    of its own: a signal to its process group reaches every process it starts, as Ctrl-C in a terminal does,
    and a test that fails can kill them all."""
    return subprocess.Popen(
        [str(part) for part in command],
        cwd=REPO,
        env={**run_env(), **(env or {})},
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """The process failed with a single `error: ...` line on stderr, holding `fragments`; no traceback."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr[-3000:])
    return errors[0]


def train_small(
    synth: Path,
    out_dir: Path,
    *overrides: str,
    launcher: tuple[str, ...] = (sys.executable,),
    config: str = "crnn.yaml",
    timeout: float = 300,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """train.py with `config` on `synth`'s train and val sets, SMALL_RUN, then `overrides` (one process;
    TORCHRUN_TWO for two); its result, whatever the exit code unless `check` (run_command's)."""
    return run_command(*launcher, *small_training(synth, out_dir, config), *overrides, timeout=timeout, check=check)


def small_training(synth: Path, out_dir: Path, config: str = "crnn.yaml") -> tuple[str, ...]:
    """train.py's arguments for a SMALL_RUN with `config` on `synth`'s train and val sets into `out_dir`: what
    train_small runs, for a test that starts it itself (start_command) to act on it while it trains."""
    return (
        "train.py",
        "--config",
        config,
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
    )


def calibration_errors(results: dict) -> list[float]:
    """The ECE before and after of each row of eval.sh's --json, each row's `calibration` popped: they are sums of
    confidences, which carry float noise in their last digits between batch sizes and process counts, so a test
    compares them approximately and the rest exactly."""
    popped = [row.pop("calibration") for row in [*results["sets"], results["combined"]]]
    return [figures[key] for figures in popped for key in ("ece_before", "ece_after")]


def read_lmdb(path: Path) -> list[tuple[bytes, str]]:
    """Every (image bytes, label) of an LMDB, in index order (also where a test's dataset holds it open)."""
    from data.lmdb_env import lmdb_for_scan

    with lmdb_for_scan(path) as env, env.begin() as txn:
        count = int(txn.get(b"num-samples"))
        return [(txn.get(b"image-%09d" % i), txn.get(b"label-%09d" % i).decode()) for i in range(1, count + 1)]


def write_images(synth: Path, folder: Path, count: int, start: int = 0) -> list[Path]:
    """`count` JPEGs of the val set, written under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (image_bytes, _) in enumerate(read_lmdb(synth / "val")[start : start + count], start=start):
        paths.append(folder / f"val{index:02d}.jpg")
        paths[-1].write_bytes(image_bytes)
    return paths


@pytest.fixture(scope="session", autouse=True)
def cache_home(tmp_path_factory) -> Iterator[Path]:
    """The caches of every test and every process it starts, kept out of the user's own: the label index
    (data.index_cache=auto) and precision auto's timings (~/.cache), and torch.compile's kernels (inductor's
    folder in the system's temporary folder by default, shared by every run on the machine: a kernel compiled
    there by a run with the CPU's own ATen kernels failed in one with ATEN_CPU_CAPABILITY=avx2)."""
    home = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(home))
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(home / "torchinductor"))
        yield home


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Path:
    """A synthetic dataset: OUT/train (96 samples), OUT/val (33: odd, so shards differ in size), OUT/test (20)."""
    out = tmp_path_factory.mktemp("data") / "synth"
    run_command(
        sys.executable,
        REPO / "scripts" / "make_synthetic.py",
        "--out",
        out,
        "--train",
        "96",
        "--val",
        "33",
        "--test",
        "20",
        "--workers",
        "1",
        cwd=None,
        timeout=600,
        check=True,
    )
    return out


@pytest.fixture(scope="session")
def tiny_run(synth, tmp_path_factory) -> Path:
    """A run folder of a 4-step CPU run with a small LSTM (about 10 s): real best.pt and last.pt for the
    tools that read checkpoints. Shared by every test that asks for it: copy it before changing it."""
    out_dir = tmp_path_factory.mktemp("runs") / "tiny"
    steps = ("train.max_steps=4", "train.eval_every=4", "train.log_every=4")
    train_small(synth, out_dir, *steps, "data.augment=strong", "train.tensorboard=true", check=True)
    return out_dir


@pytest.fixture(scope="session")
def checkpoint(tiny_run) -> Path:
    """tiny_run's best.pt: the checkpoint a test runs a command on (predict.py, export.py, eval.sh, ...)."""
    return tiny_run / "best.pt"


def _join_and_run(rank: int, store: str, target, args: tuple, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    result = target(rank, *args)
    if rank == 0:
        results.put(result)
    dist.barrier()
    dist.destroy_process_group()


def run_on_two_processes(target, tmp_path: Path, *args):
    """`target(rank, *args)` in two spawned processes joined by a gloo group; rank 0's return value.

    Return numpy arrays or plain values: tensors would travel as shared-memory handles that die with
    the process.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    store = tmp_path / f"store-{os.urandom(4).hex()}"
    processes = [
        context.Process(target=_join_and_run, args=(rank, str(store), target, args, results)) for rank in range(2)
    ]
    for process in processes:
        process.start()
    try:
        result = results.get(timeout=180)
    finally:
        for process in processes:
            process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0, 0]
    return result
