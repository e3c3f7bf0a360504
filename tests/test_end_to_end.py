"""The whole application as a user runs it: torchrun on 2 CPU processes (gloo), then the checkpoint
in a fresh process, then scripts/eval.sh with 1 and 2 processes."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from data.lmdb_writer import write_lmdb
from tests.conftest import REPO, SMALL_RUN, TORCHRUN_TWO, calibration_errors, run_command, train_small
from utils.precision import cpu_has_native_bf16

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it


def train(
    synth: Path, out_dir: Path, *overrides: str, launcher: tuple[str, ...] = TORCHRUN_TWO, check: bool = True
) -> subprocess.CompletedProcess:
    """train.py as a user runs it, for 4 steps: SMALL_RUN (train_small's) with validations every 2 steps, a loader
    worker, a short warm-up, strong augmentation (validation and eval.sh must not augment: they are compared
    below), and crnn.yaml's own model width and TensorBoard; then `overrides`."""
    return train_small(
        synth,
        out_dir,
        "train.max_steps=4",
        "train.eval_every=2",
        "train.log_every=1",
        "train.eval_batch_size=8",
        "data.num_workers=1",
        "optim.warmup_steps=2",
        "optim.lr=0.002",  # the compiled run's drift from eager grows with the rate: its tolerances are for this one
        "data.augment=strong",
        "model.hidden_size=128",  # crnn.yaml's own, as the tolerances below were measured with
        "train.tensorboard=true",
        *overrides,
        launcher=launcher,
        timeout=600,
        check=check,
    )


@pytest.fixture(scope="module")
def ddp_run(synth, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("runs") / "ddp"
    train(synth, out_dir)
    return out_dir


def test_ddp_training_writes_checkpoints_config_and_metrics(ddp_run):
    assert (ddp_run / "last.pt").is_file() and (ddp_run / "best.pt").is_file()
    assert "batch_size: 8" in (ddp_run / "config.yaml").read_text()
    records = [json.loads(line) for line in (ddp_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val" not in r] == [1, 2, 3, 4]  # written once, by rank 0 only
    val = [r for r in records if "val" in r]
    assert [r["step"] for r in val] == [2, 4] and all(r["samples"] == 33 for r in val)  # each sample once
    checkpoint = torch.load(ddp_run / "last.pt", weights_only=True)
    assert checkpoint["step"] == 4 and checkpoint["world_size"] == 2
    assert {"model", "optimizer", "scheduler", "config", "alphabet"} <= checkpoint.keys()
    assert not [key for key in checkpoint["model"] if key.startswith(("module.", "_orig_mod."))]


def logged_losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "val" not in r]


def test_compiled_ddp_training_computes_what_eager_does_and_saves_plain_names(ddp_run, synth, tmp_path):
    out_dir = tmp_path / "compiled"
    train(synth, out_dir, "train.compile=true")
    compiled, eager = logged_losses(out_dir), logged_losses(ddp_run)
    # Step 1 runs both on the same weights: fused kernels only sum in another order. Later steps drift,
    # because Adam's first updates are about lr * sign(gradient), and the sign of a near-zero gradient
    # is float noise: 1.9e-5 at step 2 with hidden size 320 and the font packages' data, 1.7e-3 by step 4
    # (an AVX-512 CPU, fp32).
    assert compiled[0] == pytest.approx(eager[0], rel=1e-5)
    assert compiled[1] == pytest.approx(eager[1], rel=1e-4)
    assert compiled == pytest.approx(eager, rel=2e-2)
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["model"].keys() == torch.load(ddp_run / "last.pt", weights_only=True)["model"].keys()


@pytest.mark.skipif(
    not cpu_has_native_bf16(),
    reason="this CPU has no native bf16 (lscpu lists neither avx512_bf16 nor amx_bf16, or oneDNN's ISA is "
    "capped below them): bf16 is emulated there, several times slower than fp32, or not computed at all",
)
def test_bf16_training_on_a_cpu_that_runs_it_natively(ddp_run, synth, tmp_path):
    out_dir = tmp_path / "bf16"
    output = train(synth, out_dir, "train.precision=bf16")
    assert "precision bf16" in output.stdout + output.stderr
    bf16, fp32 = logged_losses(out_dir), logged_losses(ddp_run)
    # The same weights and batch: bf16's 8-bit mantissa moves the first loss by about 1e-2, not more.
    assert bf16[0] == pytest.approx(fp32[0], rel=3e-2)
    assert all(math.isfinite(loss) for loss in bf16) and bf16[-1] < bf16[0]
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    floats = [value for value in checkpoint["model"].values() if value.is_floating_point()]
    assert all(value.dtype == torch.float32 and torch.isfinite(value).all() for value in floats)  # fp32 master weights
    val = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if '"val"' in line]
    assert [r["samples"] for r in val] == [33, 33] and all(math.isfinite(r["loss"]) for r in val)


def test_checkpoint_loads_in_a_fresh_cpu_process_strict_and_weights_only(ddp_run, synth):
    code = f"""
import torch
from models import build_model
checkpoint = torch.load({str(ddp_run / 'best.pt')!r}, map_location='cpu', weights_only=True)
settings = {{key: value for key, value in checkpoint['config']['model'].items() if key != 'sync_bn'}}
model = build_model(num_classes=len(checkpoint['alphabet']) + 1, **settings)  # as docs/training.md loads it
model.load_state_dict(checkpoint['model'], strict=True)
print(tuple(model.eval()(torch.zeros(1, 1, 32, 100)).shape))
from training.checkpoint import load_model
model, codec, config, preprocessing = load_model({str(ddp_run / 'best.pt')!r}, 'cpu')
print(codec.alphabet)
"""
    output = run_command(sys.executable, "-c", code, timeout=600, check=True).stdout.split()
    assert output[-4:-1] == ["(1,", "26,", "37)"] and output[-1] == "0123456789abcdefghijklmnopqrstuvwxyz"


def test_eval_sh_gives_the_same_numbers_for_one_and_two_processes(ddp_run, synth, tmp_path):
    results = {}
    for nproc in (1, 2):
        json_path = tmp_path / f"eval{nproc}.json"
        output = run_command(
            "bash",
            "scripts/eval.sh",
            ddp_run / "best.pt",
            synth / "val",
            synth / "train",
            "--json",
            json_path,
            "--batch-size",
            "5",
            "--precision",
            "fp32",
            env={"NPROC": str(nproc), "PYTHON": sys.executable},
            timeout=600,
            check=True,
        )
        table = output.stdout.split("\n\n")[0]  # not the accuracy-by-confidence table below it
        assert "combined (weighted by samples)" in table and table.count("val ") == 1
        results[nproc] = json.loads(json_path.read_text())
    noisy = {}  # confidences and losses carry float noise in their last digits; the rest is exact
    for nproc, result in results.items():
        noisy[nproc] = [
            row.pop(key) for row in [*result["sets"], result["combined"]] for key in ("mean_confidence", "loss")
        ] + calibration_errors(result)
    assert noisy[1] == pytest.approx(noisy[2], rel=1e-5)
    assert results[1] == results[2]
    sets = {row["name"]: row for row in results[1]["sets"]}
    assert sets["val"]["samples"] == 33 and sets["train"]["samples"] == 96
    assert results[1]["combined"]["samples"] == 129


def test_validation_during_training_scores_the_saved_model(ddp_run, synth, tmp_path):
    """Both ranks evaluate with rank 0's BatchNorm statistics, i.e. the model in last.pt."""
    json_path = tmp_path / "last.json"
    run_command(
        "bash",
        "scripts/eval.sh",
        ddp_run / "last.pt",
        synth / "val",
        "--json",
        json_path,
        "--precision",
        "fp32",
        env={"PYTHON": sys.executable},
        timeout=600,
        check=True,
    )
    [offline] = json.loads(json_path.read_text())["sets"]
    records = [json.loads(line) for line in (ddp_run / "metrics.jsonl").read_text().splitlines()]
    during = [r for r in records if "val" in r][-1]
    for key in ("samples", "accuracy", "cer", "one_minus_ned"):
        assert during[key] == offline[key], key
    # The sensitive one: a rank evaluating with its own last batch's statistics moves the loss.
    assert during["loss"] == pytest.approx(offline["loss"], rel=1e-5)


def test_one_process_resumes_a_ddp_checkpoint(ddp_run, synth, tmp_path):
    out_dir = tmp_path / "resumed"
    output = train(
        synth, out_dir, "train.max_steps=6", f"train.resume={ddp_run / 'last.pt'}", launcher=(sys.executable,)
    )
    assert "resumed from" in output.stdout + output.stderr
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["step"] == 6 and checkpoint["world_size"] == 1


def test_resuming_from_weights_only_is_a_clear_error(ddp_run, synth, tmp_path):
    result = train(
        synth, tmp_path / "run", f"train.resume={ddp_run / 'best.pt'}", launcher=(sys.executable,), check=False
    )
    assert result.returncode == 1 and "holds weights only (best.pt?)" in result.stderr


def test_resuming_with_another_alphabet_is_a_clear_error(ddp_run, synth, tmp_path):
    """Another order of the same characters too: the classifier's rows would mean other characters."""
    for number, alphabet in enumerate(("0123456789abcdefghijklmnopqrstuvwxy", "1023456789abcdefghijklmnopqrstuvwxyz")):
        result = train(
            synth,
            tmp_path / str(number),
            f"data.alphabet={alphabet}",
            f"train.resume={ddp_run / 'last.pt'}",
            launcher=(sys.executable,),
            check=False,
        )
        assert result.returncode == 1
        assert f"error: train.resume: {ddp_run / 'last.pt'} was trained with another alphabet" in result.stderr


def test_ddp_training_survives_batches_emptied_by_undecodable_images(tmp_path):
    """14 of 16 images cannot be decoded: most per-rank batches of 2 end up empty, and both ranks
    still step together (an empty batch gives zero gradients instead of stopping DDP)."""
    not_an_image = (REPO / "tests" / "conftest.py").read_bytes()
    image = io.BytesIO()
    Image.new("L", (80, 32), 200).save(image, format="PNG")
    samples = [(image.getvalue(), "ab") if i in (3, 11) else (not_an_image, "cd") for i in range(16)]
    write_lmdb(tmp_path / "broken", samples)
    out_dir = tmp_path / "run"
    run_command(
        *TORCHRUN_TWO,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{tmp_path / 'broken'}]",
        f"data.val=[{tmp_path / 'broken'}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.batch_size=4",
        "train.max_steps=6",
        "train.eval_every=6",
        "train.log_every=6",
        "train.precision=auto",  # crnn.yaml's own
        timeout=600,
        check=True,
    )
    [record] = [
        json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if '"val"' not in line
    ]
    assert record["undecodable_images"] > 12 and record["loss"] == record["loss"]  # counted; finite, not NaN
    assert torch.load(out_dir / "last.pt", weights_only=True)["step"] == 6
