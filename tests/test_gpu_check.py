"""tools/gpu_check.sh and its report (tools/gpu_report.py): without CUDA it says so and runs nothing; its
rehearsal runs every step of every part on the CPU; a call cut off keeps what it measured. The GPU half of the
lane: tests/test_cuda.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_env

spec = importlib.util.spec_from_file_location("gpu_report", REPO / "tools" / "gpu_report.py")
gpu_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_report)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the check itself")
def test_the_gpu_check_says_there_is_no_cuda_and_writes_nothing(tmp_path):
    result = subprocess.run(
        ["bash", "tools/gpu_check.sh"],
        cwd=REPO,
        env={**run_env(), "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "CUDA is not available on this machine" in result.stdout and "nothing was run" in result.stdout
    assert "REHEARSE=1" in result.stdout
    assert not (tmp_path / "out").exists()


def test_an_interpreter_without_torch_is_an_error_not_a_machine_without_cuda(tmp_path):
    """On a GPU image whose `python3` is not the one with torch, the check must fail, not "pass" having run
    nothing (seen on the first lent GPU: the CUDA probe's ImportError read as no CUDA)."""
    without_site = tmp_path / "python"
    without_site.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # -S: no site-packages, so no torch
    without_site.chmod(0o755)
    result = subprocess.run(
        ["bash", "tools/gpu_check.sh", "lane"],
        cwd=REPO,
        env={**run_env(), "OUT": str(tmp_path / "out"), "PYTHON": str(without_site)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"{without_site} cannot import torch" in result.stderr and "set PYTHON" in result.stderr
    assert "nothing was run" not in result.stdout and not (tmp_path / "out").exists()


def step(name: str, part: str, kind: str, status: str, **figures) -> dict:
    return {"name": name, "part": part, "kind": kind, "status": status, "seconds": 1.0, "figures": figures}


def test_a_step_cut_off_leaves_the_steps_before_it_in_the_report(tmp_path):
    """A lent machine's call ends at its limit with a KILL: what was measured before must be in report.json,
    and the step that was running named as cut off."""
    loading = {"num_workers_per_process": 4, "data_loading_images_per_s": {"per_process_rank0": 900.0, "total": 900.0}}
    gpu_report.put_step(tmp_path, step("loading_workers_4", "bench", "loading", "passed", **loading))
    gpu_report.put_step(tmp_path, step("tests/test_cuda.py::test_x", "lane", "lane-test", "skipped"))
    running = {"name": "bench_gpu_recipe", "part": "bench", "kind": "benchmark", "status": "running"}
    gpu_report.put_step(tmp_path, {**running, "started": "12:00:00"})
    # ... and here the machine killed everything: nothing more is written.
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(s["name"], s["status"]) for s in report["steps"]] == [
        ("loading_workers_4", "passed"),
        ("tests/test_cuda.py::test_x", "skipped"),
        ("bench_gpu_recipe", "running"),
    ]
    assert report["steps"][0]["figures"] == loading
    assert gpu_report.problems(report, ["bench"]) == ["bench_gpu_recipe: running: cut off (started 12:00:00)"]
    assert "| bench | bench_gpu_recipe | running |  | cut off (started 12:00:00) |" in gpu_report.render(report)
    gpu_report.put_step(tmp_path, step("bench_gpu_recipe", "bench", "benchmark", "failed"))  # recorded in its place
    names = [s["name"] for s in json.loads((tmp_path / "report.json").read_text())["steps"]]
    assert names == ["loading_workers_4", "tests/test_cuda.py::test_x", "bench_gpu_recipe"]


def test_the_report_check_names_each_step_that_did_not_measure(tmp_path):
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"weights")
    report = {
        "environment": {},
        "settings": {},
        "steps": [
            step("lane_collect", "lane", "lane-collect", "passed", tests=["tests/test_cuda.py::test_x"]),
            step("tests/test_cuda.py::test_x", "lane", "lane-test", "skipped", message="needs CUDA"),
            step("loading_workers_4", "bench", "loading", "passed", data_loading_images_per_s={"total": 0.0}),
            {"name": "loading_workers_8", "part": "bench", "kind": "loading", "status": "skipped", "reason": "no time"},
            step("train", "train", "train", "passed", checkpoint=str(tmp_path / "missing.pt")),
            step("eval_batch_1", "train", "eval", "passed", images_per_s=None),
        ],
    }
    assert gpu_report.problems(report, ["lane"]) == []
    assert gpu_report.problems(report, ["bench", "train"]) == [
        "loading_workers_4: data_loading_images_per_s.total is 0.0, not a rate",
        "loading_workers_8: skipped: no time",
        "train: no checkpoint (best.pt) was written",
        "eval_batch_1: images_per_s is None, not a rate",
    ]
    report["steps"][2:] = [
        step("train", "train", "train", "passed", checkpoint=str(checkpoint)),
        step(
            "eval_batch_1",
            "train",
            "eval",
            "passed",
            **gpu_report.eval_figures("x\n812 images/s on 1 process(es), cuda\n"),
        ),
    ]
    assert gpu_report.problems(report, ["lane", "train"]) == []
    assert gpu_report.problems(report, ["bench"]) == ["part bench: no step in the report"]


@pytest.mark.slow  # about 3 minutes on 2 idle cores: some 25 processes of torch start-up
def test_the_gpu_check_rehearsed_on_the_cpu_runs_every_step_and_reports_each(synth, tmp_path):
    """REHEARSE=1: every step of the three parts on the CPU, from another folder, on the suite's small LMDBs.
    The interpreter is wrapped to copy report.json each time the script starts Python, which shows whether
    the report held every finished step while the last one still ran (a cut there keeps them)."""
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\ncp "{tmp_path}/out/report.json" "{snapshots}/$(date +%s%N).json" 2>/dev/null\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    settings = {
        "OUT": "out",
        "SCRATCH": str(tmp_path / "scratch"),
        "DATA": str(synth),
        "WHEELS": str(tmp_path / "no_wheels"),
    }
    # Three of the lane's tests, one with a parameter in its id: each is one more pytest start-up on the CPU.
    lane = "share_one_gpu or mixed_precision_steps"
    budgets = {"LANE_SECONDS": "600", "BENCH_SECONDS": "600", "TRAIN_SECONDS": "600"}  # a busy CPU skips nothing
    result = subprocess.run(
        ["bash", str(REPO / "tools" / "gpu_check.sh"), "lane", "bench", "train"],
        cwd=tmp_path,
        env={**run_env(), **settings, **budgets, "REHEARSE": "1", "PYTHON": str(python), "LANE_SELECT": lane},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = tmp_path / "out"
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert sorted(path.name for path in out.iterdir()) == ["log.txt", "report.json", "report.md"]
    report = json.loads((out / "report.json").read_text())
    steps = {entry["name"]: entry for entry in report["steps"]}
    lane_tests = [
        "tests/test_cuda.py::test_two_processes_share_one_gpu_over_gloo",
        "tests/test_cuda.py::test_mixed_precision_steps_are_finite_and_the_loss_falls[bf16]",
        "tests/test_cuda.py::test_mixed_precision_steps_are_finite_and_the_loss_falls[fp16]",
    ]
    bench = ["bench_gpu_recipe", "bench_cpu_recipe", "loading_workers_1", "loading_workers_2", "bench_gpu_recipe_2proc"]
    names = list(steps)  # the lane's tests in the order they started: side by side, either may be first
    assert names[0] == "lane_collect" and sorted(names[1:4]) == sorted(lane_tests)
    assert names[4:] == [*bench, "train", "eval_batch_1", "eval_batch_16"]
    assert report["environment"]["device"] == "cpu" and report["settings"]["rehearsal"] == "1"

    assert steps["lane_collect"]["figures"]["tests"] == lane_tests
    for name in lane_tests:
        assert steps[name]["status"] == "skipped" and "needs CUDA" in steps[name]["figures"]["message"]
    precision = report["settings"]["precision"]
    for name in bench:
        figures = steps[name]["figures"]
        assert steps[name]["status"] == "passed" and figures["global_batch"] == 8
        assert figures["data_loading_images_per_s"]["total"] > 0
    for name in ["bench_gpu_recipe", "bench_cpu_recipe", "bench_gpu_recipe_2proc"]:
        figures = steps[name]["figures"]
        assert figures["precision"] == precision and figures["train_images_per_s"]["total"] > 0
        assert figures["compute_floor_images_per_s"]["total"] > 0 and figures["loop_fraction_of_floor"] > 0
    # crnn_gpu.yaml's two BiLSTMs (the rehearsal's widths are small), crnn.yaml's one, two processes sharing
    assert steps["bench_gpu_recipe"]["figures"]["model_settings"]["lstm_layers"] == 2
    assert steps["bench_cpu_recipe"]["figures"]["model_settings"]["lstm_layers"] == 1
    assert steps["bench_gpu_recipe_2proc"]["figures"]["processes"] == 2
    assert [steps[f"loading_workers_{n}"]["figures"]["num_workers_per_process"] for n in (1, 2)] == [1, 2]
    train = steps["train"]["figures"]
    assert steps["train"]["status"] == "passed" and train["steps"] == 4 and Path(train["checkpoint"]).is_file()
    for name in ["eval_batch_1", "eval_batch_16"]:
        assert steps[name]["status"] == "passed" and steps[name]["figures"]["images_per_s"] > 0

    log = (out / "log.txt").read_text()
    assert all(f"== {name} (at most" in log for name in steps) and "images/s on 1 process(es), cpu" in log
    assert "| bench | bench_gpu_recipe_2proc | passed |" in (out / "report.md").read_text()
    assert result.stdout.count("every step of") == 3
    during_last = [
        json.loads(path.read_text())
        for path in sorted(snapshots.iterdir())
        if {s["name"]: s["status"] for s in json.loads(path.read_text())["steps"]}.get("eval_batch_16") == "running"
    ]
    assert during_last, "report.json never showed the last step running"
    assert during_last[-1]["steps"][:-1] == report["steps"][:-1]
