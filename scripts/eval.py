"""Evaluate a checkpoint on LMDB sets; run it through scripts/eval.sh.

    scripts/eval.sh runs/crnn/best.pt datasets/synth/val [more LMDBs ...] [--json results.json]
    NPROC=2 scripts/eval.sh runs/crnn/best.pt datasets/synth/val      # 2 processes, same numbers

Every sample is evaluated exactly once whatever the number of processes, and the metrics are sums
of integers, so the results do not depend on NPROC or the batch size.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # so the project imports from any working directory
from data.lmdb_dataset import LmdbDataset  # noqa: E402
from data.transforms import ImageTransform  # noqa: E402
from models import output_frames  # noqa: E402
from utils.checkpoint import load_model  # noqa: E402
from utils.config import ConfigError, load_config  # noqa: E402
from utils.distributed import cleanup_distributed, setup_distributed  # noqa: E402
from utils.evaluate import build_eval_loader, evaluate  # noqa: E402
from utils.metrics import COUNT_KEYS, summarize  # noqa: E402
from utils.precision import resolve_precision  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint of train.py, or a bare state dict with --config")
    parser.add_argument("lmdbs", nargs="+", help="LMDB folders to evaluate on, one table row each")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--config", help="model and alphabet for a bare state dict (YAML, or a name in configs/)")
    parser.add_argument("--batch-size", type=int, default=256, help="per process (default 256)")
    parser.add_argument("--workers", type=int, default=2, help="data-loader workers per process")
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16", "fp16"])
    return parser.parse_args()


def format_row(name: str, metrics: dict) -> str:
    return (f"{name:<32} {metrics['samples']:>8} {100 * metrics['accuracy']:>8.2f} {100 * metrics['accuracy_ignore_case']:>8.2f}"
            f" {100 * metrics['cer']:>7.2f} {metrics['one_minus_ned']:>7.4f}")


def main() -> None:
    args = parse_args()
    config = load_config(args.config, []) if args.config else None
    env = setup_distributed(device_ids=[])
    try:
        model, codec, config = load_model(args.checkpoint, env.device, config)
        precision = resolve_precision(args.precision, env.device)
        data = config.data
        transform = ImageTransform(data.img_height, data.img_width, config.model.in_channels, data.keep_aspect)
        frames = output_frames(model, config.model.in_channels, data.img_height, data.img_width)
        sets, combined = [], dict.fromkeys(COUNT_KEYS, 0)
        start = time.perf_counter()
        for root in args.lmdbs:
            dataset = LmdbDataset(root, codec, frames, transform)
            loader = build_eval_loader(dataset, codec, args.batch_size, args.workers, env)
            counts = evaluate(model, loader, codec, env, precision)
            for key in COUNT_KEYS:
                combined[key] += counts[key]
            sets.append({"name": Path(root).name, "path": str(root), **summarize(counts), "in_lmdb": dataset.report.total,
                         "dropped": dict(dataset.report.dropped), "undecodable_images": counts["dropped"]})
        seconds = time.perf_counter() - start
        if env.is_main:
            results = {"checkpoint": str(args.checkpoint), "sets": sets, "combined": summarize(combined)}
            print(f"{'set':<32} {'samples':>8} {'acc %':>8} {'acc-ci %':>8} {'CER %':>7} {'1-NED':>7}")
            for row in sets:
                print(format_row(row["name"], row))
                skipped = row["in_lmdb"] - row["samples"]
                if skipped:
                    reasons = {**row["dropped"], "undecodable image": row["undecodable_images"]}
                    print(f"{'':<4}{skipped} of {row['in_lmdb']} not evaluated: "
                          + ", ".join(f"{n} {reason}" for reason, n in reasons.items() if n))
            print(format_row("combined (weighted by samples)", results["combined"]))
            print(f"{results['combined']['samples'] / seconds:.0f} images/s on {env.world_size} process(es), {env.device.type}")
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    finally:
        cleanup_distributed()


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
