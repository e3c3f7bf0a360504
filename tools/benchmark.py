"""Measure how fast a config trains, loads data and evaluates; print a table and write JSON.

    python tools/benchmark.py --config crnn.yaml                                  # one process, fp32 and bf16
    python tools/benchmark.py --config crnn.yaml --batch-size 64 --precision bf16 --no-channels-last
    torchrun --standalone --nproc_per_node=2 tools/benchmark.py --config crnn.yaml   # per process + total

Without --precision, every precision `train.precision=auto` chooses from on this machine (fp32 and bf16 on
a CPU whose oneDNN computes bf16) is measured side by side, in interleaved rounds, and the table says which
one `auto` picks there (its own short measurement, utils/precision.py) and how it compares with the
loop's figures. With --precision, that one alone. Measured in one run, each after warm-up steps that are
not timed:
- train loop: the real data loader and training step (forward, fp32 CTC loss, backward, clipping,
  optimizer step; DDP when launched with torchrun), images/s;
- compute floor: the same step (its augmentation on the device included) on one batch already in
  memory, so the loop's fraction of it is what data loading, host work and DDP cost;
- data loading alone: decode + transform + collate from the LMDB with the configured workers;
- evaluation: `evaluation.evaluate.evaluate` over the first validation LMDB;
- FLOPs per image (torch.utils.flop_counter), the device's dense matmul rate in the same precision,
  and peak memory (RSS; CUDA max allocated on a GPU).
Speed depends on everything else running on the machine: measure on an idle one.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from data.lmdb_dataset import Batch
from data.loaders import build_eval_loader
from evaluation.evaluate import evaluate
from models.losses import ctc_losses
from train import load_run_config, train_step
from training.config import Config, ConfigFileOption
from training.run import Setup
from training.setup import build_setup, wrap_for_training
from utils import cli
from utils.distributed import DistEnv, all_reduce_sum, cleanup_distributed, setup_distributed
from utils.precision import PRECISIONS, autocast, candidate_precisions

ROUNDS = 5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config", action=ConfigFileOption, default="crnn.yaml", help="YAML file, or a bare name looked up in configs/"
    )
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. data.num_workers=4")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="train.precision, measured alone (default: every candidate side by side)",
    )
    parser.add_argument("--batch-size", type=int, help="train.batch_size: the global batch, across processes")
    parser.add_argument("--threads", type=int, help="train.threads: CPU threads per process (0: cores / processes)")
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, help="train.channels_last")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, help="train.compile (torch.compile)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per measurement, over 5 rounds (default 30)")
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed steps before the first round of each measurement"
    )
    parser.add_argument(
        "--loading-only",
        action="store_true",
        help="measure data loading alone (decode, transform, collate with data.num_workers): no training step",
    )
    parser.add_argument("--json", type=Path, default=Path("runs/benchmark.json"), help="where to write the results")
    args = parser.parse_args()
    options = {
        "train.precision": args.precision,
        "train.batch_size": args.batch_size,
        "train.threads": args.threads,
        "train.channels_last": args.channels_last,
        "train.compile": args.compile,
    }
    # The options are overrides too, applied last: `--batch-size 64` wins over `train.batch_size=32`.
    args.overrides += [f"{key}={str(value).lower()}" for key, value in options.items() if value is not None]
    return args


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device: torch.device, precision: str) -> float:
    """Dense matmul rate in the run's precision: the ceiling the convolutions and LSTMs work under."""
    size = 4096 if device.type == "cuda" else 1024
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    with autocast(device, precision):
        for _ in range(3):
            a @ b
        synchronize(device)
        repeats = 50 if device.type == "cuda" else 10
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def flops_per_image(
    model: torch.nn.Module, images: torch.Tensor, batch: Batch, device: torch.device
) -> tuple[float, float]:
    """(forward, training step) FLOPs per image. oneDNN's fused LSTM is invisible to the counter,
    so it is switched off while counting."""
    with warnings.catch_warnings():
        # Switching oneDNN off and on makes torch warn about Intel GPUs' TF32, which concerns no one here.
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        counter = FlopCounterMode(display=False)
        with torch.backends.mkldnn.flags(enabled=False), counter:
            model(images)
        forward = counter.get_total_flops()
        counter = FlopCounterMode(display=False)
        with torch.backends.mkldnn.flags(enabled=False), counter:
            losses, _ = ctc_losses(model(images), batch.targets, batch.target_lengths, count_infinite=False)
            losses.mean().backward()
    model.zero_grad(set_to_none=True)
    return forward / len(images), counter.get_total_flops() / len(images)


def timed_images_per_second(run_step: Callable[[], int], *, steps: int, warmup: int, device: torch.device) -> float:
    """Images/s of `run_step()` (which returns its batch size) over `steps` calls after `warmup`."""
    for _ in range(warmup):
        run_step()
    synchronize(device)
    start, images = time.perf_counter(), 0
    for _ in range(steps):
        images += run_step()
    synchronize(device)
    return images / (time.perf_counter() - start)


def loading_images_per_second(batches: Iterator[Batch], *, steps: int, warmup: int, device: torch.device) -> float:
    """Images/s of the loader alone: 4x `steps` batches (each is cheap next to a step) after `warmup`."""
    return timed_images_per_second(lambda: len(next(batches).labels), steps=steps * 4, warmup=warmup, device=device)


def device_name(device: torch.device) -> str:
    return str(device) if device.type == "cpu" else torch.cuda.get_device_name(device)


def best_of_rounds(
    measurements: dict[tuple[str, str], Callable[[], int]], *, steps: int, warmup: int, device: torch.device
) -> dict[tuple[str, str], float]:
    """Images/s of each measurement's step, the best of ROUNDS rounds of `steps // ROUNDS` steps. The
    measurements alternate within each round: the machine's clock drifts by 20% over minutes, which would
    otherwise land on whichever was measured second."""
    best = dict.fromkeys(measurements, 0.0)
    for index in range(ROUNDS):
        for key, run_step in measurements.items():
            rate = timed_images_per_second(
                run_step, steps=max(1, steps // ROUNDS), warmup=warmup if index == 0 else 0, device=device
            )
            best[key] = max(best[key], rate)
    return best


def main() -> None:
    args = parse_args()
    config = load_run_config(args.config, args.overrides)
    env = setup_distributed(config.device_ids, config.train.threads)
    try:
        if args.loading_only:
            results = loading(config, env, steps=args.steps, warmup=args.warmup)
        else:
            results = benchmark(config, env, steps=args.steps, warmup=args.warmup, compare=args.precision is None)
        if env.is_main:
            report(results, args.json)
    finally:
        cleanup_distributed()


def benchmark(config: Config, env: DistEnv, *, steps: int, warmup: int, compare: bool) -> dict[str, Any]:
    """The figures of the precision the run would use (setup.precision) at the top level, and, with
    `compare`, those of every candidate precision under `by_precision`."""
    setup = build_setup(config, env, print if env.is_main else lambda _: None)
    precisions = candidate_precisions(env.device) if compare else (setup.precision,)
    measured = measure(config, env, setup, precisions, steps=steps, warmup=warmup)
    by_precision = measured["by_precision"]
    fastest = max(precisions, key=lambda precision: by_precision[precision]["train_images_per_s"]["total"])
    chosen = by_precision[setup.precision] if setup.precision in by_precision else by_precision[fastest]
    loop_total, floor_total = chosen["train_images_per_s"]["total"], chosen["compute_floor_images_per_s"]["total"]
    data_loading, train_flops = measured["data_loading_images_per_s"], measured["train_step_flops_per_image"]
    return {
        "device": device_name(env.device),
        "processes": env.world_size,
        "threads_per_process": torch.get_num_threads(),
        "configured_precision": config.train.precision,
        "precision": setup.precision,  # what train.precision (auto: measured at start-up) resolves to
        "fastest_precision_in_the_loop": fastest,
        "by_precision": by_precision,
        "channels_last": config.train.channels_last,
        "compile": config.train.compile,
        "global_batch": config.train.batch_size,
        "augment": config.data.augment,  # applied on the device in the training step: in the loop and its floor
        "model_settings": config.model.settings,
        "image_size": [config.data.img_height, config.data.img_width],
        "train_images_per_s": chosen["train_images_per_s"],
        "compute_floor_images_per_s": chosen["compute_floor_images_per_s"],
        "loop_fraction_of_floor": loop_total / floor_total,
        "data_loading_images_per_s": data_loading,
        "data_to_train_ratio": data_loading["total"] / loop_total,
        "eval_images_per_s": chosen["eval_images_per_s"],
        "forward_gflops_per_image": measured["forward_flops_per_image"] / 1e9,
        "train_step_gflops_per_image": train_flops / 1e9,
        "effective_train_gflops_per_s": loop_total * train_flops / 1e9,
        "matmul_gflops_per_s_per_process": chosen["matmul_gflops_per_s_per_process"],
        "peak_rss_mib_rank0": measured["peak_rss_mib_rank0"],
        "cuda_max_allocated_mib_rank0": measured["cuda_max_allocated_mib_rank0"],
        "torch": str(torch.__version__),
    }


def loading(config: Config, env: DistEnv, *, steps: int, warmup: int) -> dict[str, Any]:
    """Data loading alone, as `measure` times it, for sweeping data.num_workers without the training step."""
    setup = build_setup(config, env, print if env.is_main else lambda _: None)
    setup.sampler.set_steps(0, 10**9)
    batches = iter(setup.loader)
    per_process = loading_images_per_second(batches, steps=steps, warmup=warmup, device=env.device)
    return {
        "device": device_name(env.device),
        "processes": env.world_size,
        "num_workers_per_process": setup.loader_workers,  # data.num_workers, `auto` resolved
        "global_batch": config.train.batch_size,
        "augment": config.data.augment,
        "data_loading_images_per_s": summed_over_processes({"data_loading": per_process})["data_loading"],
        "torch": str(torch.__version__),
    }


def measure(
    config: Config, env: DistEnv, setup: Setup, precisions: tuple[str, ...], *, steps: int, warmup: int
) -> dict[str, Any]:
    """Every figure, in the order they are taken: FLOPs, the loop and its floor in each precision, data
    loading alone, evaluation, peak memory; rates summed over the processes where a total is given."""
    model = wrap_for_training(setup.model, env, config.train.compile)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    setup.sampler.set_steps(0, 10**9)  # as many batches as the measurements take, from one pass of the loader
    batches = iter(setup.loader)
    first = next(batches)
    on_device = (tensor.to(env.device) for tensor in (first.images, first.widths, first.seeds))
    images_in_memory = setup.device_transform(*on_device).contiguous(memory_format=setup.memory_format)
    forward_flops, train_flops = flops_per_image(setup.model, images_in_memory, first, env.device)
    measurements = training_steps(config, env, setup, model, precisions, first=first, batches=batches)
    per_process = best_of_rounds(measurements, steps=steps, warmup=warmup, device=env.device)
    data_per_process = loading_images_per_second(batches, steps=steps, warmup=warmup, device=env.device)
    eval_total = {precision: eval_images_per_second(config, env, setup, precision) for precision in precisions}
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cuda_peak_mib = torch.cuda.max_memory_allocated(env.device) / 2**20 if env.device.type == "cuda" else 0.0
    rates = summed_over_processes({**per_process, "data_loading": data_per_process})
    by_precision = {
        precision: {
            "train_images_per_s": rates[precision, "train_loop"],
            "compute_floor_images_per_s": rates[precision, "compute_floor"],
            "eval_images_per_s": eval_total[precision],
            "matmul_gflops_per_s_per_process": matmul_gflops(env.device, precision),
        }
        for precision in precisions
    }
    return {
        "by_precision": by_precision,
        "forward_flops_per_image": forward_flops,
        "train_step_flops_per_image": train_flops,
        "data_loading_images_per_s": rates["data_loading"],
        "peak_rss_mib_rank0": peak_rss_mib,
        "cuda_max_allocated_mib_rank0": cuda_peak_mib,
    }


def training_steps(
    config: Config,
    env: DistEnv,
    setup: Setup,
    model: torch.nn.Module,
    precisions: tuple[str, ...],
    *,
    first: Batch,
    batches: Iterator[Batch],
) -> dict[tuple[str, str], Callable[[], int]]:
    """Per (precision, "train_loop" or "compute_floor"), one training step of `model` that returns its batch
    size: the loop takes the loader's next batch from `batches`, its floor `first` again, already in memory."""

    def step_on(batch: Batch, precision: str) -> int:
        train_step(
            model,
            batch,
            inputs=setup.device_transform,
            optimizer=setup.optimizer,
            scaler=setup.scaler,
            grad_clip=config.optim.grad_clip,
            device=env.device,
            precision=precision,
            memory_format=setup.memory_format,
            average=setup.average,
        )
        setup.scheduler.step()
        return len(batch.labels)

    return {
        (precision, name): (
            lambda precision=precision, floor=floor: step_on(first if floor else next(batches), precision)
        )
        for precision in precisions
        for name, floor in (("train_loop", False), ("compute_floor", True))
    }


def summed_over_processes(per_process: dict[Any, float]) -> dict[Any, dict[str, float]]:
    """Each rate as this process measured it (the report shows rank 0's) and summed over every process, in
    one all-reduce: a collective, so every rank calls it alike."""
    keys = list(per_process)
    totals = all_reduce_sum(torch.tensor([per_process[key] for key in keys], dtype=torch.float64)).tolist()
    return {key: {"per_process_rank0": per_process[key], "total": total} for key, total in zip(keys, totals)}


def eval_images_per_second(config: Config, env: DistEnv, setup: Setup, precision: str) -> float:
    """Images/s of `evaluation.evaluate.evaluate` over the first validation set, all processes together."""
    if not setup.val_sets:
        return 0.0
    val_loader = build_eval_loader(
        setup.val_sets[0], setup.codec, config.train.eval_batch_size // env.world_size, setup.loader_workers, env
    )
    evaluate(setup.model, val_loader, setup.codec, env, precision, config.train.channels_last)  # warm-up: workers
    start = time.perf_counter()
    counts = evaluate(setup.model, val_loader, setup.codec, env, precision, config.train.channels_last)
    # evaluate() already summed the samples over processes: this is the total rate.
    return counts["samples"] / (time.perf_counter() - start)


def rate(images_per_s: dict[str, float], processes: int) -> str:
    if processes == 1:
        return f"{images_per_s['total']:.1f}"
    return f"{images_per_s['total']:.1f} total, {images_per_s['per_process_rank0']:.1f} on rank 0"


def report(results: dict, json_path: Path) -> None:
    """Print the table, with every precision side by side when several were measured, and write the JSON."""
    rows = summary_rows(results) if "by_precision" in results else loading_rows(results)
    if len(results.get("by_precision", ())) > 1:
        rows += [("", ""), *side_by_side_rows(results)]
    if results.get("cuda_max_allocated_mib_rank0"):
        rows.append(("CUDA max allocated, rank 0", f"{results['cuda_max_allocated_mib_rank0']:.0f} MiB"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {json_path}")


def summary_rows(results: dict) -> list[tuple[str, str]]:
    """The table's rows of the precision the run uses: what ran, how fast, how much work, how much memory."""
    processes = results["processes"]
    image_height, image_width = results["image_size"]
    return [
        ("device", f"{results['device']}, {processes} process(es) x {results['threads_per_process']} thread(s)"),
        (
            "precision / channels_last / compile",
            f"{results['precision']} / {results['channels_last']} / {results['compile']}",
        ),
        ("global batch, image", f"{results['global_batch']}, {image_height}x{image_width}"),
        ("train loop, images/s", rate(results["train_images_per_s"], processes)),
        ("compute floor, images/s", rate(results["compute_floor_images_per_s"], processes)),
        ("loop / floor", f"{100 * results['loop_fraction_of_floor']:.1f} %"),
        (
            "data loading, images/s",
            f"{rate(results['data_loading_images_per_s'], processes)} "
            f"({results['data_to_train_ratio']:.1f}x the train loop)",
        ),
        ("evaluation, images/s", f"{results['eval_images_per_s']:.1f}"),
        (
            "GFLOP per image: forward / train step",
            f"{results['forward_gflops_per_image']:.2f} / {results['train_step_gflops_per_image']:.2f}",
        ),
        ("effective train GFLOP/s", f"{results['effective_train_gflops_per_s']:.1f}"),
        ("matmul GFLOP/s per process", f"{results['matmul_gflops_per_s_per_process']:.1f}"),
        ("peak RSS, rank 0", f"{results['peak_rss_mib_rank0']:.0f} MiB"),
    ]


def loading_rows(results: dict) -> list[tuple[str, str]]:
    """The table's rows of a --loading-only run."""
    return [
        ("device", f"{results['device']}, {results['processes']} process(es)"),
        ("loader workers per process, augment", f"{results['num_workers_per_process']}, {results['augment']}"),
        ("global batch", str(results["global_batch"])),
        ("data loading, images/s", rate(results["data_loading_images_per_s"], results["processes"])),
    ]


def side_by_side_rows(results: dict) -> list[tuple[str, str]]:
    """One row per figure with every measured precision's value, and whether the precision `auto` chose in its
    own short measurement is the one that ran the loop faster."""
    figures_of = {
        "train loop, images/s": lambda figures: figures["train_images_per_s"]["total"],
        "compute floor, images/s": lambda figures: figures["compute_floor_images_per_s"]["total"],
        "evaluation, images/s": lambda figures: figures["eval_images_per_s"],
        "matmul GFLOP/s": lambda figures: figures["matmul_gflops_per_s_per_process"],
    }
    rows = [
        (
            f"{name}, side by side",
            ", ".join(f"{precision} {figure(figures):.1f}" for precision, figures in results["by_precision"].items()),
        )
        for name, figure in figures_of.items()
    ]
    fastest = results["fastest_precision_in_the_loop"]
    agrees = "agrees" if results["precision"] == fastest else "DISAGREES"
    rows.append(
        (
            f"train.precision={results['configured_precision']} resolves to",
            f"{results['precision']} ({agrees} with the loop's faster: {fastest})",
        )
    )
    return rows


if __name__ == "__main__":
    cli.run(main)
