"""tools/benchmark.py runs end to end and writes every figure it promises (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, SMALL_RUN, run_command, torchrun
from training.config import ConfigError
from utils.precision import candidate_precisions


def test_benchmark_refuses_a_config_as_train_py_does(monkeypatch):
    """Its checks are train.py's own (train.load_run_config), the eval batch's included: a config the
    training run would refuse is not measured."""
    for name, value in {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "test"}.items():
        monkeypatch.setenv(name, value)  # three processes, as torchrun would say
    monkeypatch.setattr(
        sys, "argv", ["tools/benchmark.py", "--config", "crnn.yaml", "train.batch_size=63", "train.eval_batch_size=64"]
    )
    spec = importlib.util.spec_from_file_location("benchmark", REPO / "tools" / "benchmark.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    message = "train.batch_size=63 and train.eval_batch_size=64 must divide by the 3 processes"
    with pytest.raises(ConfigError, match=re.escape(message)):
        benchmark.main()


def run_benchmark(
    synth,
    json_path,
    *overrides: str,
    options: tuple[str, ...] = (),
    launcher: tuple[str, ...] = (sys.executable,),
    env: dict | None = None,
) -> tuple[subprocess.CompletedProcess, dict]:
    """tools/benchmark.py on the synthetic set, a few steps after one of warm-up: its output and its JSON.
    The options come before the overrides, which argparse takes as one run of positional arguments."""
    result = run_command(
        *launcher,
        "tools/benchmark.py",
        "--config",
        "crnn.yaml",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
        json_path,
        *options,
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        *overrides,
        env=env,
        timeout=600,
        check=True,
    )
    return result, json.loads(json_path.read_text())


@pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it
@pytest.mark.parametrize("processes", [1, 2])
def test_benchmark_writes_its_json(synth, tmp_path, processes):
    launcher = (sys.executable,) if processes == 1 else torchrun(processes)
    result, results = run_benchmark(
        synth,
        tmp_path / "bench.json",
        *SMALL_RUN,
        "train.batch_size=4",
        "train.eval_batch_size=16",
        "data.num_workers=1",
        "model.channels=[64,128,256,256,512,512,512]",
        "data.augment=light",  # the paper's widths, augmented
        # The options win over the overrides: train.batch_size=4 above becomes 8.
        options=("--batch-size", "8", "--precision", "fp32", "--threads", "1", "--no-channels-last"),
        launcher=launcher,
    )
    assert "loop / floor" in result.stdout
    for key in ("train_images_per_s", "compute_floor_images_per_s", "data_loading_images_per_s"):
        assert results[key]["total"] > 0 and results[key]["per_process_rank0"] > 0
        # The total adds up every process's rate; one process's is a part of it.
        assert (
            results[key]["total"] > results[key]["per_process_rank0"]
            if processes > 1
            else results[key]["total"] == results[key]["per_process_rank0"]
        )
    assert results["eval_images_per_s"] > 0 and results["matmul_gflops_per_s_per_process"] > 0
    # The paper CRNN at 32x100 does about 0.7 GMAC per image forward: counted, not guessed.
    assert 1.0 < results["forward_gflops_per_image"] < 2.0
    assert results["train_step_gflops_per_image"] > 2 * results["forward_gflops_per_image"]
    assert results["processes"] == processes and results["global_batch"] == 8
    assert results["threads_per_process"] == 1 and results["channels_last"] is False
    assert results["precision"] == "fp32" and results["compile"] is False


@pytest.mark.slow
def test_without_precision_every_candidate_is_measured_side_by_side(synth, tmp_path):
    result, results = run_benchmark(
        synth,
        tmp_path / "bench.json",
        *SMALL_RUN,
        "train.batch_size=4",
        "train.eval_batch_size=16",
        "model.hidden_size=16",
        "train.precision=auto",  # crnn.yaml's own: every candidate is measured
        options=("--threads", "1"),
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    candidates = candidate_precisions(torch.device("cpu"))
    assert list(results["by_precision"]) == list(candidates)
    for figures in results["by_precision"].values():
        assert figures["train_images_per_s"]["total"] > 0 and figures["compute_floor_images_per_s"]["total"] > 0
        assert figures["eval_images_per_s"] > 0 and figures["matmul_gflops_per_s_per_process"] > 0
    assert results["configured_precision"] == "auto" and results["precision"] in candidates
    assert f"precision auto: {results['precision']} (" in result.stdout  # auto's own measurement, named
    if len(candidates) > 1:
        assert "train loop, images/s, side by side" in result.stdout
        assert re.search(rf"train.precision=auto resolves to +{results['precision']} \(", result.stdout)


@pytest.mark.slow
def test_loading_only_measures_the_loader_with_its_workers_and_no_step(synth, tmp_path):
    result, results = run_benchmark(
        synth, tmp_path / "loading.json", "train.batch_size=8", "data.num_workers=2", options=("--loading-only",)
    )
    assert results["num_workers_per_process"] == 2 and results["global_batch"] == 8
    assert results["data_loading_images_per_s"]["total"] > 0
    assert "data loading, images/s" in result.stdout and "loop / floor" not in result.stdout
    assert "train_images_per_s" not in results  # no training step was timed
