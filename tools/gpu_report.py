"""The report of tools/gpu_check.sh: OUT/report.json, rewritten after every step, so that a call cut off at
its time limit still brings back every figure measured before the cut (the step then running shows as
`running`), and OUT/report.md, rendered from it at the end of each part. The script calls it between its
steps; no torch import but in `start`, so a record costs no more than Python's own start-up.

    python tools/gpu_report.py start OUT --setting batch=512 ...            # the machine, the versions
    python tools/gpu_report.py begin OUT NAME --part bench --kind benchmark   # NAME is running
    python tools/gpu_report.py record OUT NAME --part bench --kind benchmark --exit-code 0 --seconds 41 \\
        --output OUT/log.txt --output-from 1234 --figures /tmp/gpu_check/NAME.json
    python tools/gpu_report.py skip OUT NAME --part train --kind eval --reason "no time left"
    python tools/gpu_report.py check OUT lane bench       # report.md; what failed or measured nothing: exit 1
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from utils.atomic_write import write_text_atomically

# What each kind of step measures, and so what `check` requires of its figures: benchmark.py's JSON for a
# training benchmark and a loading-only one, the run folder for the training run, the printed rate for eval.
KINDS = ("setup", "lane-collect", "lane-test", "benchmark", "loading", "train", "eval")
BENCHMARK_FIGURES = (
    ("train_images_per_s", "total"),
    ("compute_floor_images_per_s", "total"),
    ("loop_fraction_of_floor",),
    ("data_loading_images_per_s", "total"),
    ("eval_images_per_s",),
)
LOADING_FIGURES = (("data_loading_images_per_s", "total"),)
# `timeout` exits 124 when it stopped the step with TERM, 137 when it had to KILL it (-k).
TIMED_OUT_CODES = (124, 137)
EVAL_RATE = re.compile(r"^(\d+(?:\.\d+)?) images/s on (\d+) process", re.MULTILINE)
TAIL_LINES = 25


def report_path(out: Path) -> Path:
    return out / "report.json"


def read_report(out: Path) -> dict[str, Any]:
    """OUT/report.json, or an empty report where there is none yet."""
    path = report_path(out)
    if not path.exists():
        return {"environment": {}, "settings": {}, "steps": []}
    return json.loads(path.read_text(encoding="utf-8"))


def write_report(out: Path, report: dict[str, Any]) -> None:
    # Replaced whole: a call killed mid-write leaves the previous report, never half of one.
    write_text_atomically(report_path(out), json.dumps(report, indent=1) + "\n")


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold OUT's lock: the lane's tests run side by side, and each rewrites the report when it ends."""
    handle = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def put_step(out: Path, step: dict[str, Any]) -> None:
    """Put `step` into the report in place of the step of its name (its `running` entry), or at its end."""
    with locked(out):
        report = read_report(out)
        steps = [kept for kept in report["steps"] if kept["name"] != step["name"]]
        position = next((i for i, kept in enumerate(report["steps"]) if kept["name"] == step["name"]), len(steps))
        report["steps"] = [*steps[:position], step, *steps[position:]]
        write_report(out, report)


def environment() -> dict[str, Any]:
    """The machine and the versions that ran the check."""
    import torch

    cuda = torch.cuda.is_available()
    driver = ""
    if cuda and shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True, timeout=60).stdout.strip()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "driver": driver or None,
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
    }


def status_of(exit_code: int) -> str:
    if exit_code == 0:
        return "passed"
    return "timed out" if exit_code in TIMED_OUT_CODES else "failed"


def lane_result(junit: Path) -> tuple[str, str]:
    """(status, message) of the one test a pytest run's JUnit XML reports: passed, failed or skipped."""
    case = ElementTree.parse(junit).find(".//testcase")
    if case is None:
        return "failed", f"{junit} reports no test"
    for tag, status in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
        element = case.find(tag)
        if element is not None:
            return status, (element.get("message") or "").strip()
    return "passed", ""


def train_figures(run_dir: Path) -> dict[str, Any]:
    """What a training run folder shows: the last step and loss, the images/s of its log lines (the first,
    which holds the start-up, left out where there are others), the last validation, the checkpoint."""
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    logged = [record for record in records if "loss" in record and "val" not in record]
    rates = [record["images_per_s"] for record in logged[1:] or logged]
    validations = [record for record in records if "val" in record]
    checkpoint = run_dir / "best.pt"
    return {
        "steps": logged[-1]["step"] if logged else None,
        "first_loss": logged[0]["loss"] if logged else None,
        "last_loss": logged[-1]["loss"] if logged else None,
        "train_images_per_s": sorted(rates)[len(rates) // 2] if rates else None,  # the median log line
        "val_accuracy": validations[-1].get("accuracy") if validations else None,
        "checkpoint": str(checkpoint) if checkpoint.exists() else None,
        "checkpoint_mib": round(checkpoint.stat().st_size / 2**20, 1) if checkpoint.exists() else None,
    }


def eval_figures(output: str) -> dict[str, Any]:
    """scripts/eval.py's rate line: `N images/s on P process(es), DEVICE`."""
    match = EVAL_RATE.search(output)
    return {"images_per_s": float(match[1]) if match else None, "processes": int(match[2]) if match else None}


def collected_tests(output: str) -> list[str]:
    """The test ids `pytest --collect-only -q` printed, one a line."""
    return [line.strip() for line in output.splitlines() if "::" in line and not line.startswith("==")]


def read_output(path: Path, start: int) -> str:
    with path.open("rb") as file:
        file.seek(start)
        return file.read().decode("utf-8", errors="replace")


def finished_step(args: argparse.Namespace) -> dict[str, Any]:
    """The report's entry of a step that ran: its status from the exit code (for a lane test, from its JUnit
    XML), its figures by its kind, and its output's last lines where it did not pass."""
    output = read_output(args.output, args.output_from)
    status, figures = status_of(args.exit_code), {}
    if args.kind == "lane-test" and status != "timed out" and args.junit and args.junit.exists():
        status, message = lane_result(args.junit)
        figures = {"message": message} if message else {}
    elif args.kind == "lane-collect":
        figures = {"tests": collected_tests(output)}
    elif args.kind in ("benchmark", "loading") and args.figures and args.figures.exists():
        figures = json.loads(args.figures.read_text())
    elif args.kind == "train":
        figures = train_figures(args.run_dir)
    elif args.kind == "eval":
        figures = eval_figures(output)
    step = {"name": args.name, "part": args.part, "kind": args.kind, "status": status, "seconds": args.seconds}
    step["figures"] = figures
    if status in ("failed", "timed out"):
        step["output_tail"] = output.splitlines()[-TAIL_LINES:]
    return step


def summary(step: dict[str, Any]) -> str:
    """One line of a step's main figures, for the console and report.md."""
    try:
        return figures_line(step)
    except (KeyError, TypeError, ValueError):  # a figure benchmark.py no longer writes: report.json has the rest
        return "(see report.json)"


def figures_line(step: dict[str, Any]) -> str:
    figures, kind = step.get("figures", {}), step["kind"]
    if step["status"] == "running":
        return f"cut off (started {step.get('started', '?')})"
    if step["status"] == "skipped" and "reason" in step:
        return step["reason"]
    if kind == "benchmark" and "train_images_per_s" in figures:
        return (
            f"{figures['precision']}, batch {figures['global_batch']}, {figures['processes']} process(es): "
            f"loop {figures['train_images_per_s']['total']:.0f} img/s, floor "
            f"{figures['compute_floor_images_per_s']['total']:.0f} ({100 * figures['loop_fraction_of_floor']:.0f} %), "
            f"loading {figures['data_loading_images_per_s']['total']:.0f}, eval {figures['eval_images_per_s']:.0f}"
        )
    if kind == "loading" and "data_loading_images_per_s" in figures:
        return (
            f"{figures['num_workers_per_process']} worker(s) per process: "
            f"{figures['data_loading_images_per_s']['total']:.0f} img/s"
        )
    if kind == "train" and figures.get("steps") is not None:
        return (
            f"{figures['steps']} steps, loss {figures['first_loss']:.3f} -> {figures['last_loss']:.3f}, "
            f"{figures['train_images_per_s']:.0f} img/s, val accuracy {figures['val_accuracy']}"
        )
    if kind == "eval" and figures.get("images_per_s") is not None:
        return f"{figures['images_per_s']:.0f} images/s"
    if kind == "lane-collect":
        return f"{len(figures.get('tests', []))} test(s)"
    return figures.get("message", "")


def render(report: dict[str, Any]) -> str:
    """report.md: the machine, one table row per step, then the output's last lines of each step that did not pass."""
    env = report["environment"]
    lines = [
        f"# GPU check: {env.get('device')} x {env.get('gpus')}"
        + (" (REHEARSAL on the CPU)" if report["settings"].get("rehearsal") == "1" else ""),
        "",
        f"torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, driver {env.get('driver')}, "
        f"Python {env.get('python')}, {env.get('cpus')} CPU cores",
        "",
        "settings: " + ", ".join(f"{key}={value}" for key, value in report["settings"].items()),
        "",
        "| part | step | status | s | figures |",
        "|---|---|---|---|---|",
    ]
    for step in report["steps"]:
        row = [step["part"], step["name"], step["status"], str(step.get("seconds", "")), summary(step)]
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    for step in report["steps"]:
        if step.get("output_tail"):
            lines += ["", f"## {step['name']}: {step['status']}", "", "```", *step["output_tail"], "```"]
    return "\n".join(lines) + "\n"


def figure(figures: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        figures = figures.get(key) if isinstance(figures, dict) else None
    return figures


def is_rate(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def problems(report: dict[str, Any], parts: list[str]) -> list[str]:
    """Why the report of `parts` is not complete: a part without steps, a step that did not pass (a lane
    test may be skipped: the two-GPU one on one GPU, every one on a CPU), a figure that is not a positive
    number, a checkpoint that is not there. Empty where every step of `parts` ran and measured."""
    steps = [step for step in report["steps"] if step["part"] in parts]
    found = [f"part {part}: no step in the report" for part in parts if not any(s["part"] == part for s in steps)]
    for step in steps:
        name, figures = step["name"], step.get("figures", {})
        allowed = ("passed", "skipped") if step["kind"] == "lane-test" else ("passed",)
        if step["status"] not in allowed:
            found.append(": ".join(filter(None, [name, step["status"], summary(step)])))
            continue
        wanted = {"benchmark": BENCHMARK_FIGURES, "loading": LOADING_FIGURES, "eval": (("images_per_s",),)}
        for keys in wanted.get(step["kind"], ()):
            if not is_rate(figure(figures, keys)):
                found.append(f"{name}: {'.'.join(keys)} is {figure(figures, keys)!r}, not a rate")
        if step["kind"] == "train" and not (figures.get("checkpoint") and Path(figures["checkpoint"]).is_file()):
            found.append(f"{name}: no checkpoint (best.pt) was written")
        if step["kind"] == "lane-collect" and not figures.get("tests"):
            found.append(f"{name}: no test was collected")
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (_, text) in COMMANDS.items():
        commands.add_parser(name, help=text).add_argument("out", type=Path, help="the check's OUT folder")
    start, record, skip, check = (commands.choices[name] for name in ("start", "record", "skip", "check"))
    start.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE", help="what the check ran with")
    for name in ("begin", "record", "skip"):
        command = commands.choices[name]
        command.add_argument("name", help="the step's name, unique in the report")
        command.add_argument("--part", required=True)
        command.add_argument("--kind", required=True, choices=KINDS)
    record.add_argument("--exit-code", type=int, required=True)
    record.add_argument("--seconds", type=float, required=True)
    record.add_argument("--output", type=Path, required=True, help="the file the step's output went to")
    record.add_argument("--output-from", type=int, default=0, help="where in --output the step's output begins")
    record.add_argument("--append-output-to", type=Path, help="append the step's output to this log, under the lock")
    record.add_argument("--figures", type=Path, help="benchmark.py's JSON")
    record.add_argument("--junit", type=Path, help="a lane test's JUnit XML")
    record.add_argument("--run-dir", type=Path, help="the training run's folder")
    skip.add_argument("--reason", required=True)
    check.add_argument("parts", nargs="+")
    return parser.parse_args()


def start(args: argparse.Namespace) -> None:
    with locked(args.out):
        report = read_report(args.out)
        report["environment"] = environment()
        report["settings"].update(setting.split("=", 1) for setting in args.setting)
        write_report(args.out, report)
    env = report["environment"]
    print(
        f"{env['device']} x {env['gpus']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
        f"driver {env['driver']}, Python {env['python']}, {env['cpus']} CPU cores"
    )


def begin(args: argparse.Namespace) -> None:
    step = {"name": args.name, "part": args.part, "kind": args.kind, "status": "running"}
    put_step(args.out, {**step, "started": time.strftime("%H:%M:%S")})


def record(args: argparse.Namespace) -> None:
    step = finished_step(args)
    if args.append_output_to:
        with locked(args.out), args.append_output_to.open("a") as log:
            log.write(read_output(args.output, args.output_from))
    put_step(args.out, step)
    print(f"{step['name']}: {step['status']} ({step['seconds']:.0f} s) {summary(step)}".rstrip(), flush=True)
    if "output_tail" in step:
        print("\n".join(f"    {line}" for line in step["output_tail"][-12:]), flush=True)


def skip(args: argparse.Namespace) -> None:
    put_step(
        args.out, {"name": args.name, "part": args.part, "kind": args.kind, "status": "skipped", "reason": args.reason}
    )
    print(f"{args.name}: skipped, {args.reason}", flush=True)


def check(args: argparse.Namespace) -> None:
    report = read_report(args.out)
    write_text_atomically(args.out / "report.md", render(report))
    found = problems(report, args.parts)
    print("\n".join(f"NOT OK: {problem}" for problem in found) or f"every step of {' '.join(args.parts)} ran")
    sys.exit(1 if found else 0)


COMMANDS = {
    "start": (start, "write the machine and the versions into the report"),
    "begin": (begin, "mark a step as running"),
    "record": (record, "put a step's status and figures in place of its running mark"),
    "skip": (skip, "note a step that was not run, and why"),
    "check": (check, "render report.md; list the steps of PARTS that failed or measured nothing; exit 1 if any"),
}


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run, _ = COMMANDS[args.command]
    run(args)


if __name__ == "__main__":
    main()
