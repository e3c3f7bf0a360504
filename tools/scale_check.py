"""Measure the project at MJSynth + SynthText's size: start-up with a cold and a warm label-index
cache (1 and 2 processes), memory per process and per data-loader worker over 5,000 steps, the
sampler's cost per step, and reading speed against a small LMDB of the same images.

    python tools/make_scale_lmdb.py --out datasets/scale15m --samples 15000000
    python tools/make_scale_lmdb.py --out datasets/scale50k --samples 50000
    python tools/scale_check.py --big datasets/scale15m --small datasets/scale50k --val datasets/synth/val

Prints each figure and writes them all to --json. Run it on an idle machine: it times real torchrun
launches of train.py (the crnn.yaml recipe) and real data loaders. docs/data.md holds this machine's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset
from data.loaders import build_train_loader
from data.samplers import GlobalBatchSampler
from data.transforms import build_transform
from training.alphabet_policy import run_alphabet
from training.config import load_config
from utils.distributed import DistEnv

REPO = Path(__file__).resolve().parents[1]
# MJSynth's three LMDBs and SynthText's, as configs/mjst.yaml draws them on 8 GPUs.
MJST_SIZES, MJST_RATIOS, MJST_BATCH, MJST_WORLD = (
    [7_224_586, 802_731, 891_924, 5_522_807],
    [0.405, 0.045, 0.05, 0.5],
    192,
    8,
)
# A small model: the memory and start-up measured are the data pipeline's, not the network's.
SMALL_MODEL = ["model.hidden_size=32", "model.channels=[8,16,16,16,32,32,32]"]


def evict_from_page_cache(lmdb_folder: Path) -> None:
    """Drop the LMDB's file pages from the page cache (no root needed): the next reads go to the disk."""
    fd = os.open(lmdb_folder / "data.mdb", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# Loader workers per training process, as a run at this size has them on GPUs (crnn.yaml loads in the
# training processes, for 2-core CPUs): their start-up and their memory are part of what is measured.
LOADER_WORKERS = 2


def train_command(nproc: int, lmdb: Path, val: Path, cache: Path, out_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{lmdb}]",
        f"data.val=[{val}]",
        f"data.index_cache={cache}",
        f"train.out_dir={out_dir}",
        f"data.num_workers={LOADER_WORKERS}",
        "train.overwrite=true",
        "train.tensorboard=false",
        *overrides,
    ]


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def seconds_to_first_step(nproc: int, lmdb: Path, val: Path, cache: Path, work: Path) -> float:
    """From launching torchrun to the end of the first optimizer step, as its metrics record stamps it."""
    out_dir = work / "startup"
    launched = time.time()
    subprocess.run(
        train_command(nproc, lmdb, val, cache, out_dir, "train.max_steps=1", "train.log_every=1", *SMALL_MODEL),
        cwd=REPO,
        env=child_env(),
        check=True,
        capture_output=True,
    )
    first = json.loads((out_dir / "metrics.jsonl").read_text().splitlines()[0])
    return first["time"] - launched


def measure_startup(big: Path, small: Path, val: Path, work: Path) -> dict:
    results = {}
    for nproc in (1, 2):
        cache = work / f"cache{nproc}"
        evict_from_page_cache(big)
        cold = seconds_to_first_step(nproc, big, val, cache, work)  # no index cache, LMDB pages on disk
        warm = seconds_to_first_step(nproc, big, val, cache, work)
        seconds_to_first_step(nproc, small, val, cache, work)  # builds the small LMDB's entry
        model_only = seconds_to_first_step(nproc, small, val, cache, work)
        results[f"{nproc}_process"] = {
            "cold_s": round(cold, 1),
            "warm_s": round(warm, 1),
            "small_lmdb_warm_s": round(model_only, 1),
            "warm_beyond_small_s": round(warm - model_only, 1),
        }
        print(
            f"start-up, {nproc} process(es): cold {cold:.1f} s, warm {warm:.1f} s, the {small.name} LMDB "
            f"{model_only:.1f} s: warm costs {warm - model_only:+.1f} s beyond the model's own start",
            flush=True,
        )
    return results


def process_tree(root_pid: int) -> dict[int, int]:
    """pid -> parent pid of `root_pid` and everything it started."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    tree, frontier = {}, [root_pid]
    while frontier:
        parent = frontier.pop()
        for child in children.get(parent, []):
            tree[child] = parent
            frontier.append(child)
    return tree


def memory_mb(pid: int) -> dict[str, float]:
    """Memory in MB: `rss`; `private`, the pages this process wrote and shares with no other (its heap
    since the fork: what copying on access would grow; a read-only LMDB's pages are never dirty);
    `pss`, the pages it holds with shared ones split between their sharers (summed over processes,
    the machine's real use); `file`, the mapped files' share of that (LMDB, libraries: reclaimable)."""
    kb = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        kb[name] = int(value.split()[0])
    return {
        "rss": kb["Rss"] / 1024,
        "private": kb["Private_Dirty"] / 1024,
        "pss": kb["Pss"] / 1024,
        "file": kb["Pss_File"] / 1024,
    }


def measure_memory(big: Path, val: Path, work: Path, checkpoints: list[int]) -> list[dict]:
    """Memory of every training process and worker when the run's metrics first reach each step in
    `checkpoints`; the run is stopped after the last (its schedule runs on, so nothing is ending then)."""
    # The schedule runs far beyond the last snapshot: a small model reaches twice its step between two
    # polls, and a run that is ending takes its workers away while they are being measured.
    out_dir, beyond = work / "memory", 100 * checkpoints[-1]
    schedule = [
        f"train.max_steps={beyond}",
        "train.log_every=10",
        f"train.eval_every={beyond}",
        f"train.save_every={beyond}",
    ]
    command = train_command(2, big, val, work / "cache2", out_dir, *schedule, *SMALL_MODEL)
    agent = subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    snapshots, pending = [], list(checkpoints)
    try:
        while pending and agent.poll() is None:
            time.sleep(0.5)
            step = last_logged_step(out_dir / "metrics.jsonl")
            if step < pending[0]:
                continue
            processes = memory_of_run(agent.pid)
            snapshots.append({"step": step, "processes": processes})
            private = {
                role: [round(p["private"]) for p in processes if p["role"] == role] for role in ("trainer", "worker")
            }
            print(
                f"memory at step {step}: private MB, trainers {private['trainer']}, workers {private['worker']}; "
                f"PSS of all {sum(p['pss'] for p in processes):.0f} MB",
                flush=True,
            )
            pending.pop(0)
    finally:
        stop_agent(agent)
    if pending:
        raise RuntimeError(
            f"the memory run ended (exit {agent.returncode}) before step {pending[0]}: {' '.join(command)}"
        )
    return snapshots


def last_logged_step(metrics: Path) -> int:
    """The latest step whose training loss the run's metrics hold (0 before the first)."""
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return max((json.loads(line).get("step", 0) for line in lines if '"loss"' in line), default=0)


def memory_of_run(agent_pid: int) -> list[dict]:
    """memory_mb of each training process torchrun's agent started, then of each of their loader workers."""
    tree = process_tree(agent_pid)
    trainers = sorted(pid for pid, parent in tree.items() if parent == agent_pid)
    processes = [{"role": "trainer", "pid": pid, **memory_mb(pid)} for pid in trainers]
    return processes + [
        {"role": "worker", "pid": pid, "of": parent, **memory_mb(pid)}
        for pid, parent in sorted(tree.items())
        if parent in trainers
    ]


def stop_agent(agent: subprocess.Popen) -> None:
    """End the run if it still runs: gently, then by force after two minutes."""
    if agent.poll() is None:
        agent.terminate()  # torchrun passes SIGTERM on to the training processes, which stop cleanly
        try:
            agent.wait(timeout=120)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def private_mb() -> float:
    return memory_mb(os.getpid())["private"]


def measure_sampler(sizes: list[int], ratios: list[float] | None, batch: int, world: int, steps: int = 2000) -> dict:
    """The first global batch (which draws each dataset's epoch permutation) and the mean of the next ones."""
    before = private_mb()
    sampler = GlobalBatchSampler(sizes, batch, 0, world, seed=0, ratios=ratios)
    started = time.perf_counter()
    sampler.global_batch_indices(0)
    first = time.perf_counter() - started
    started = time.perf_counter()
    for step in range(1, steps + 1):
        sampler.global_batch_indices(step)
    per_step = (time.perf_counter() - started) / steps
    result = {
        "samples": sum(sizes),
        "ratios": ratios,
        "global_batch": batch,
        "first_batch_ms": round(first * 1e3, 1),
        "per_batch_ms": round(per_step * 1e3, 3),
        "memory_mb": round(private_mb() - before, 1),
        "per_batch_over_an_epoch_ms": round(
            (first + per_step * sampler.batches_per_epoch) / sampler.batches_per_epoch * 1e3, 3
        ),
    }
    print(
        f"sampler, {sum(sizes):,} samples, ratios {ratios}: first batch {result['first_batch_ms']} ms (draws the "
        f"permutations), then {result['per_batch_ms']} ms per batch; permutations {result['memory_mb']} MB",
        flush=True,
    )
    return result


def loader_images_per_s(lmdb: Path, cache: Path, batches: int, workers: int, batch_size: int = 256) -> float:
    """The training loader alone (read, decode, resize, collate) over random global batches."""
    config = load_config("crnn.yaml", [f"data.train=[{lmdb}]"])
    codec = CTCCodec(run_alphabet(config), fold_case=config.data.fold_case)
    dataset = LmdbDataset(lmdb, codec, 31, build_transform(config, train=True), index_cache=cache)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    loader, sampler = build_train_loader([dataset], codec, batch_size, None, 0, workers, env)
    sampler.set_steps(0, batches)
    iterator = iter(loader)
    next(iterator)  # workers started
    started, images = time.perf_counter(), 0
    for batch in iterator:
        images += len(batch.labels)
    return images / (time.perf_counter() - started)


def measure_reading(big: Path, small: Path, work: Path, batches: int, workers: int) -> dict:
    results = {}
    for name, lmdb in ((small.name, small), (big.name, big)):
        evict_from_page_cache(lmdb)
        rate = loader_images_per_s(lmdb, work / "cache1", batches, workers)
        results[name] = round(rate)
        print(f"reading {name} ({workers} workers, pages evicted first): {rate:,.0f} images/s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", type=Path, required=True, help="the large LMDB (tools/make_scale_lmdb.py)")
    parser.add_argument("--small", type=Path, required=True, help="a small LMDB of the same images, e.g. 50,000")
    parser.add_argument("--val", type=Path, required=True, help="a small validation LMDB for the runs")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["startup", "memory", "sampler", "reading"],
        default=["startup", "memory", "sampler", "reading"],
    )
    parser.add_argument("--memory-steps", type=int, nargs="+", default=[10, 1000, 5000])
    parser.add_argument("--read-batches", type=int, default=200, help="batches of 256 per reading measurement")
    parser.add_argument(
        "--workers", type=int, default=LOADER_WORKERS, help="loader workers for the reading measurement"
    )
    parser.add_argument("--json", type=Path, default=Path("runs/scale_check.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scale_check."))
    results: dict = {"big": str(args.big), "small": str(args.small), "torch": torch.__version__, "cpus": os.cpu_count()}
    try:
        if "startup" in args.only:
            results["startup"] = measure_startup(args.big, args.small, args.val, work)
        if "memory" in args.only:
            results["memory"] = measure_memory(args.big, args.val, work, args.memory_steps)
        if "sampler" in args.only:
            results["sampler"] = [
                measure_sampler(MJST_SIZES, MJST_RATIOS, MJST_BATCH, MJST_WORLD),
                measure_sampler([sum(MJST_SIZES)], None, MJST_BATCH, MJST_WORLD),
            ]
        if "reading" in args.only:
            results["reading_images_per_s"] = measure_reading(
                args.big, args.small, work, args.read_batches, args.workers
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
