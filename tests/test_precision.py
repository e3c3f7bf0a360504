from __future__ import annotations

import json
import sys

import pytest
import torch

import training.precision_choice
import utils.precision
from models import model_from_config
from tests.conftest import SMALL_RUN, run_command
from training.config import ModelConfig
from training.precision_choice import choose_precision
from utils.precision import autocast, candidate_precisions, resolve_precision
from utils.sync_batchnorm import CpuSyncBatchNorm, convert_sync_batchnorm


def test_explicit_precisions_are_taken_as_given():
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    assert "fp32" in candidate_precisions(torch.device("cpu"))


def test_auto_with_one_candidate_says_which_and_why_without_timing(monkeypatch):
    """A CPU without bf16 in oneDNN (AVX2 only), or a GPU: nothing to measure, and the log still names the
    choice, as it does where two candidates were timed."""
    monkeypatch.setattr(utils.precision, "candidate_precisions", lambda device: ("fp32",))
    lines = []

    def time_step(precision: str) -> float:
        raise AssertionError("one candidate is not timed")

    assert resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lines.append) == "fp32"
    assert lines == ["precision auto: fp32 (the one candidate: oneDNN computes no bf16 on this CPU)"]


@pytest.fixture
def two_candidates(monkeypatch, tmp_path):
    """A CPU where both precisions can run, with a cache of its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(utils.precision, "candidate_precisions", lambda device: ("fp32", "bf16"))
    return tmp_path / "crnn-ocr" / "precision.json"


@pytest.mark.parametrize("faster", ["fp32", "bf16"])
def test_auto_takes_whichever_precision_the_measurement_favours(two_candidates, faster):
    calls, lines = [], []

    def time_step(precision: str) -> float:
        calls.append(precision)
        return 0.010 if precision == faster else 0.013

    assert resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lines.append) == faster
    assert set(calls) == {"fp32", "bf16"} and len(calls) >= 6  # a warm-up and several interleaved rounds each
    assert lines[0].startswith(f"precision auto: {faster} (fp32 ") and "measured now" in lines[0]
    # A second start with the same step on this machine pays nothing and chooses the same.
    calls.clear()
    assert resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lines.append) == faster
    assert calls == [] and "measured before on this machine" in lines[1]
    assert json.loads(two_candidates.read_text())  # the cache is a readable file
    # Another step shape is measured anew.
    resolve_precision("auto", torch.device("cpu"), time_step, "shape B", lines.append)
    assert calls


def test_another_cpu_generation_of_the_same_name_is_measured_anew(two_candidates, monkeypatch):
    """Two AMD EPYC generations share their model name (and may share flags): a cache folder shared by a
    cluster's nodes must not hand one generation's choice to the other."""
    calls = []

    def time_step(precision: str) -> float:
        calls.append(precision)
        return 0.010

    def cpu(family: str) -> str:
        return f"processor\t: 0\ncpu family\t: {family}\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: avx2\n"

    monkeypatch.setattr(utils.precision, "cpu_info", lambda: cpu("25"))
    resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lambda _: None)
    assert calls
    calls.clear()
    resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lambda _: None)
    assert calls == []  # the same CPU: cached
    monkeypatch.setattr(utils.precision, "cpu_info", lambda: cpu("26"))
    resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lambda _: None)
    assert calls  # another generation: measured
    keys = list(json.loads(two_candidates.read_text()))
    assert len(keys) == 2 and "AMD EPYC family 25 model 2" in keys[0] and "family 26" in keys[1]


def test_kernels_capped_below_the_cpus_own_are_measured_anew(two_candidates, monkeypatch):
    """`ATEN_CPU_CAPABILITY=avx2` (or oneDNN's ISA capped) makes this CPU compute as one without AVX-512: its
    fp32 and bf16 steps then time otherwise, and the choice made with the CPU's own kernels does not hold."""
    calls = []

    def time_step(precision: str) -> float:
        calls.append(precision)
        return 0.010

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lambda _: None)
    calls.clear()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lambda _: None)
    assert calls  # other kernels: measured
    calls.clear()
    resolve_precision("auto", torch.device("cpu"), time_step, "shape A", lambda _: None)
    assert calls == []  # and cached under them
    assert "kernels AVX2 onednn AVX2" in list(json.loads(two_candidates.read_text()))[-1]


def test_a_candidate_twice_as_slow_is_not_timed_to_the_end(two_candidates):
    calls = []

    def time_step(precision: str) -> float:
        calls.append(precision)
        return 0.030 if precision == "bf16" else 0.010

    assert resolve_precision("auto", torch.device("cpu"), time_step, "emulated bf16", lambda _: None) == "fp32"
    assert calls.count("bf16") == 2 and calls.count("fp32") > 2  # warm-up and one round
    calls.clear()

    def emulated(precision: str) -> float:
        calls.append(precision)
        return 0.5 if precision == "bf16" else 0.010

    assert resolve_precision("auto", torch.device("cpu"), emulated, "25x slower", lambda _: None) == "fp32"
    assert calls.count("bf16") == 1  # one warm-up step 50x slower is enough


@pytest.mark.parametrize("faster", ["fp32", "bf16"])
def test_the_models_own_steps_are_timed_and_the_faster_precision_chosen(two_candidates, monkeypatch, faster):
    """Real training steps of a real CRNN in each precision; the clock is made to favour one."""
    last_precision = []
    real_autocast = training.precision_choice.autocast

    def recording_autocast(device, precision):
        last_precision.append(precision)
        return real_autocast(device, precision)

    def fake_clock(step):
        step()
        return 0.010 if last_precision[-1] == faster else 0.020

    monkeypatch.setattr(training.precision_choice, "autocast", recording_autocast)
    monkeypatch.setattr(training.precision_choice, "timed", fake_clock)
    model = model_from_config(ModelConfig(hidden_size=16, settings={"channels": [4, 8, 8, 8, 8, 8, 8]}), 11)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    for training_step in (True, False):
        choice = choose_precision(
            "auto", torch.device("cpu"), model, (2, 1, 32, 64), training=training_step, log=lambda _: None
        )
        assert choice == faster
    assert set(last_precision) == {"fp32", "bf16"}
    # Timing trained a copy: the model's weights and BatchNorm statistics are as they were, with no gradients.
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())
    assert all(parameter.grad is None for parameter in model.parameters())


def test_a_model_with_global_batch_statistics_is_timed_without_collectives(two_candidates):
    """Each rank times its own copy and may drop a candidate sooner than another: an all-reduce in the
    timed step would pair mismatched steps. Here there is no process group, so one would raise."""
    model = convert_sync_batchnorm(
        model_from_config(ModelConfig(hidden_size=16, settings={"channels": [4, 8, 8, 8, 8, 8, 8]}), 11),
        torch.device("cpu"),
    )
    assert any(isinstance(module, CpuSyncBatchNorm) for module in model.modules())
    choice = choose_precision("auto", torch.device("cpu"), model, (2, 1, 32, 64), training=True, log=lambda _: None)
    assert choice in ("fp32", "bf16")
    assert any(isinstance(module, CpuSyncBatchNorm) for module in model.modules())  # the model itself is untouched


def test_fp16_needs_cuda():
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", torch.device("cpu"))


def test_bf16_autocast_runs_the_forward_in_bf16_on_the_cpu():
    layer = torch.nn.Linear(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert layer(torch.randn(2, 4)).dtype == torch.float32


@pytest.mark.slow
def test_a_run_with_auto_measures_records_its_choice_and_resumes_with_it(synth, tmp_path):
    out_dir = tmp_path / "run"
    command = [
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.batch_size=4",
        "train.eval_every=2",
        "model.hidden_size=16",
        "train.precision=auto",
    ]
    environment = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = run_command(*command, "train.max_steps=2", env=environment)
    assert first.returncode == 0, first.stderr
    [line] = [line for line in first.stdout.splitlines() if "precision auto:" in line]
    choice = line.split("precision auto: ")[1].split()[0]
    assert choice in candidate_precisions(torch.device("cpu")) and f"precision {choice}," in first.stdout
    assert torch.load(out_dir / "last.pt", weights_only=True)["precision"] == choice
    resumed = run_command(*command, "train.max_steps=4", env=environment)
    assert resumed.returncode == 0, resumed.stderr
    assert f"precision auto: {choice}, as the run measured it at its start" in resumed.stdout


def test_a_gpu_that_only_emulates_bf16_trains_in_fp16(monkeypatch):
    """torch.cuda.is_bf16_supported() answers True on a V100 or T4 by default, where bf16 is emulated and slow."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert candidate_precisions(torch.device("cuda", 0)) == ("fp16",)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert candidate_precisions(torch.device("cuda", 0)) == ("bf16",)
