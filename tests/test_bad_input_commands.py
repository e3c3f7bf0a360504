"""Bad input, round 3, on the commands: Ctrl-C and SIGTERM end every command with one line and 130 or 143,
eval.sh's NPROC, export's file names and writes, predict's devices, and options of eval.sh, predict.py,
export.py and import_weights.py that were taken silently or named wrongly.

Real processes where the entry point matters (a signal to a running command, eval.sh); the rest in-process.
"""

from __future__ import annotations

import argparse
import builtins
import errno
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import SMALL_RUN, TORCHRUN_TWO, run_command, start_command, write_images
from training.checkpoint import save_checkpoint
from utils import cli
from utils.atomic_write import write_text_atomically
from utils.preemption import FORWARDED_BY_LAUNCHER, StopSignal

SIGNALS = [signal.SIGINT, signal.SIGTERM]


def run_cli(main) -> tuple[int, str]:
    """Exit code and stderr of `cli.run(main)`, in this process."""
    with pytest.raises(SystemExit) as exited:
        cli.run(main)
    code = exited.value.code
    return (code, "") if isinstance(code, int) else (1, code)


def signal_self(signum: int) -> None:
    """Send `signum` to this process; its Python handler has run when this returns (or raised from here)."""
    signal.raise_signal(signum)


# --- signals: one line and 128 + the signal, for every command -------------------------------------------


@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_stops_a_command_with_one_line_the_shells_exit_code_and_its_clean_up(signum, capsys):
    cleaned = []

    def main() -> int:
        try:
            signal_self(signum)
            return 0
        finally:
            cleaned.append(True)

    before = [signal.getsignal(signum) for signum in SIGNALS]
    code, _ = run_cli(main)
    assert code == 128 + signum
    assert capsys.readouterr().err == f"stopped by {signal.Signals(signum).name}; no file was left half-written\n"
    assert cleaned == [True]
    assert [signal.getsignal(signum) for signum in SIGNALS] == before  # the handlers are put back


def test_a_signal_that_comes_out_as_another_error_or_is_swallowed_is_still_reported_as_the_stop(capsys):
    def import_interrupted() -> int:
        try:
            signal_self(signal.SIGINT)
        except BaseException:  # what onnxruntime's C extension does with a Ctrl-C while it imports
            raise ImportError("initialization failed") from None
        return 0

    def swallowed() -> int:
        try:
            signal_self(signal.SIGTERM)
        except BaseException:
            pass
        return 0

    assert run_cli(import_interrupted)[0] == 130
    assert run_cli(swallowed)[0] == 143
    assert capsys.readouterr().err.splitlines() == [
        "stopped by SIGINT; no file was left half-written",
        "stopped by SIGTERM; no file was left half-written",
    ]


def test_a_second_sigterm_lets_the_clean_up_finish_and_a_second_ctrl_c_does_not(capsys):
    cleaned = []

    def main(signum: int) -> int:
        try:
            signal_self(signum)
        finally:
            signal_self(signum)  # SLURM signals every process of a step; torchrun forwards SIGTERM too
            cleaned.append(signum)
        return 0

    assert run_cli(lambda: main(signal.SIGTERM))[0] == 143
    assert cleaned == [signal.SIGTERM]
    assert run_cli(lambda: main(signal.SIGINT))[0] == 130  # the user insisting: the clean-up is cut short
    assert cleaned == [signal.SIGTERM]


def test_a_signal_while_train_loads_a_checkpoint_is_a_stop_not_a_broken_checkpoint(tmp_path, monkeypatch, capsys):
    from training.checkpoint import load_checkpoint

    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"model": {"w": torch.ones(1)}, "step": 2})
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: signal_self(signal.SIGTERM))

    def main() -> None:
        stop = StopSignal()  # as train.py's main(): before the loop, a signal stops at once
        try:
            load_checkpoint(path)  # its `except Exception` for foreign files used to turn the stop into one
        finally:
            stop.restore()

    assert run_cli(main)[0] == 143
    assert capsys.readouterr().err == "stopped by SIGTERM before training started; nothing was saved\n"


@pytest.mark.parametrize("under_torchrun", [True, False])
def test_under_torchrun_a_second_sigint_is_torchruns_forward_and_the_checkpoint_is_still_written(
    under_torchrun, monkeypatch
):
    # Ctrl-C reaches torchrun and its workers together, and torchrun then sends its workers a SIGINT of
    # its own: a worker that took that for the user insisting would stop without its checkpoint.
    if under_torchrun:
        monkeypatch.setenv(FORWARDED_BY_LAUNCHER, "some-run")
    else:
        monkeypatch.delenv(FORWARDED_BY_LAUNCHER, raising=False)
    handlers = cli.StopHandlers()  # what cli.run has installed when train.py's main() starts
    stop = StopSignal()
    try:
        stop.defer(None)  # the loop runs
        signal_self(signal.SIGINT)
        if under_torchrun:
            signal_self(signal.SIGINT)
            assert stop.agreed() == signal.SIGINT  # noted, the loop checkpoints at the next step boundary
        else:
            with pytest.raises(cli.Stopped):  # a second Ctrl-C in a terminal: stop at once
                signal_self(signal.SIGINT)
    finally:
        stop.restore()
        handlers.restore()


@pytest.mark.slow
def test_ctrl_c_to_torchrun_checkpoints_on_every_rank_and_torchrun_ends_as_documented(synth, tmp_path):
    out_dir = tmp_path / "run"
    process = start_command(
        *TORCHRUN_TWO,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.max_steps=5000",
        "train.log_every=1",
        "train.eval_every=5000",
        "train.save_every=5000",
        env={"PYTHONUNBUFFERED": "1"},
    )
    metrics = out_dir / "metrics.jsonl"
    while not metrics.is_file() or len(metrics.read_text().splitlines()) < 3:  # the loop runs
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C does: torchrun and both workers get it
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("torchrun did not stop")
    output = stdout + stderr
    stopped = [line[line.index("stopped by") :] for line in output.splitlines() if "stopped by SIGINT at step" in line]
    assert len(stopped) == 2 and stopped[0] == stopped[1], output[-4000:]  # torchrun's own SIGINT did not cut it short
    step = int(stopped[0].split("at step ")[1].split(";")[0])
    assert (out_dir / f"ckpt-{step:07d}.pt").is_file()
    # torchrun's part, which no training script can change (docs/training.md): its traceback, exit status 1.
    assert "SignalException: Process" in output and process.returncode == 1


def start(command: list[str]) -> subprocess.Popen:
    """`python COMMAND`, unbuffered, in its own process group, as a terminal's foreground job: Ctrl-C reaches every
    process of it."""
    return start_command(sys.executable, *command, env={"PYTHONUNBUFFERED": "1"})


def has_data_loader_worker(pid: int) -> bool:
    """Whether process `pid` has a child that torch named as its data-loader worker (other children, such
    as ldconfig run while torch is imported, come before the command's handlers)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if (
                int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid
                and (stat.parent / "comm").read_text().strip() == "pt_data_worker"
            ):
                return True
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while we looked
    return False


def stopped_with_one_line(process: subprocess.Popen, signum: int) -> None:
    os.killpg(process.pid, signum)
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("the signal was ignored")
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    message = f"stopped by {signal.Signals(signum).name}; no file was left half-written"
    # A progress bar on stderr ends without a newline: the message may follow it on its line.
    assert stderr.count(message) == 1 and any(line.endswith(message) for line in stderr.splitlines()), stderr


@pytest.fixture
def many_images(synth, tmp_path) -> Path:
    """A folder of 3,000 images (links to one): read one at a time, predict.py is still reading seconds later."""
    image = write_images(synth, tmp_path / "one", 1)[0]
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(3000):
        os.link(image, folder / f"{index:05d}.jpg")
    return folder


@pytest.mark.slow
def test_ctrl_c_in_predict_stops_it_with_one_line_and_130(tiny_run, many_images):
    process = start(
        ["scripts/predict.py", str(tiny_run / "best.pt"), str(many_images), "--batch-size", "1", "--precision", "fp32"]
    )
    process.stdout.readline()  # the first reading: the model is loaded and reading
    stopped_with_one_line(process, signal.SIGINT)


@pytest.mark.slow
def test_predict_piped_into_a_reader_that_stops_early_ends_quietly_as_head_expects(tiny_run, many_images):
    process = start(
        ["scripts/predict.py", str(tiny_run / "best.pt"), str(many_images), "--batch-size", "1", "--precision", "fp32"]
    )
    assert process.stdout.readline().startswith(str(many_images))  # `| head -1`: one line, then the pipe closes
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 128 + signal.SIGPIPE  # what `yes | head -1` gives: not an error
    assert stderr == "", stderr  # was `error: [Errno 32] Broken pipe`


@pytest.mark.slow
def test_sigterm_in_eval_stops_it_with_one_line_and_143_and_writes_no_results(tiny_run, synth, tmp_path):
    from data.lmdb_writer import write_lmdb
    from tests.conftest import read_lmdb

    samples = read_lmdb(synth / "val")
    big = tmp_path / "big"
    write_lmdb(big, (samples[index % len(samples)] for index in range(20_000)))
    results = tmp_path / "results.json"
    process = start(
        [
            "scripts/eval.py",
            str(tiny_run / "best.pt"),
            str(big),
            "--json",
            str(results),
            "--precision",
            "fp32",
            "--workers",
            "1",
            "--batch-size",
            "8",
            "--index-cache",
            "off",
        ]
    )
    while not has_data_loader_worker(process.pid):  # the evaluation has started
        assert process.poll() is None, process.communicate()
        time.sleep(0.01)
    stopped_with_one_line(process, signal.SIGTERM)
    assert not results.exists()


@pytest.mark.slow
def test_sigterm_to_create_lmdb_while_it_writes_exits_143_with_one_line(synth, tmp_path):
    image = write_images(synth, tmp_path / "one", 1)[0]
    images = tmp_path / "images"
    images.mkdir()
    lines = []
    for index in range(20_000):  # each one decoded and checked: seconds of writing
        os.link(image, images / f"{index:05d}.jpg")
        lines.append(f"{index:05d}.jpg\tabc\n")
    (tmp_path / "gt.txt").write_text("".join(lines))
    out = tmp_path / "lmdb"
    process = start(
        ["scripts/create_lmdb.py", "--images", str(images), "--gt", str(tmp_path / "gt.txt"), "--out", str(out)]
    )
    while not any(path.name.startswith(f".{out.name}.") for path in tmp_path.iterdir()):  # the LMDB being written
        assert process.poll() is None, process.communicate()
        time.sleep(0.01)
    stopped_with_one_line(process, signal.SIGTERM)
    assert not out.exists()


@pytest.mark.slow
def test_ctrl_c_to_make_synthetic_with_rendering_workers_is_one_line_not_one_traceback_per_worker(tmp_path):
    out = tmp_path / "synth"
    process = start(
        [
            "scripts/make_synthetic.py",
            "--out",
            str(out),
            "--train",
            "20000",
            "--val",
            "0",
            "--test",
            "0",
            "--workers",
            "2",
        ]
    )
    while not out.is_dir() or not any(path.name.startswith(".train.") for path in out.iterdir()):  # writing
        assert process.poll() is None, process.communicate()
        time.sleep(0.01)
    stopped_with_one_line(process, signal.SIGINT)


# --- eval.sh's NPROC ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("nproc", ["0", "abc", "-2", "1.5"])
def test_eval_sh_names_an_nproc_that_is_not_a_count_of_processes(nproc):
    result = run_command("bash", "scripts/eval.sh", "best.pt", "lmdb", env={"NPROC": nproc}, timeout=60)
    assert result.returncode == 1
    assert result.stderr == (
        f"error: NPROC={nproc}: give the number of processes, a whole number from 1 (e.g. "
        "NPROC=2), or leave it unset for one\n"
    )


# --- export.py -----------------------------------------------------------------------------------------------


class Widths(nn.Module):
    """A small convolution: what export() writes, in a moment."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.conv(images).mean(dim=2).transpose(1, 2)  # [B, W, 4]


def test_a_failed_write_of_an_export_names_the_file_and_leaves_the_previous_one(tmp_path, monkeypatch):
    from interop.export import export

    out = tmp_path / "model.pt2"
    out.write_bytes(b"the previous export")

    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as raised:
        export(Widths(), torch.zeros(2, 1, 8, 16), "pt2", out, {"crnn": "{}"}, min_width=8)
    assert cli.describe(raised.value) == (
        f"{out}: No space left on device; the disk is full: free space or write "
        "elsewhere (files already in place were left intact)"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["model.pt2"]
    assert out.read_bytes() == b"the previous export"

    monkeypatch.undo()
    export(Widths(), torch.zeros(2, 1, 8, 16), "pt2", out, {"crnn": "{}"}, min_width=8)
    program = torch.export.load(out)
    assert program.module()(torch.zeros(3, 1, 8, 24)).shape == (3, 24, 4)  # batch and width left free


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["--format", "onnx", "--out", "model.pt2"],
            "--format onnx and --out model.pt2 disagree: the onnx file's name "
            "must end in .onnx; give e.g. --out model.onnx, or --format pt2",
        ),
        (
            ["--format", "pt2", "--out", "best.pt"],
            "--format pt2 and --out best.pt disagree: the pt2 file's name must end "
            "in .pt2; give e.g. --out best.pt2",
        ),
        (
            ["--format", "easyocr", "--out", "m.onnx"],
            "--format easyocr and --out m.onnx disagree: easyocr writes a folder, "
            "not a .onnx file; give a folder, e.g. --out m_easyocr, or --format "
            "onnx",
        ),
        (
            ["--format", "onnx", "--name", "mine"],
            "--name is for --format easyocr; --format onnx has no name or language " "list",
        ),
        (
            ["--format", "pt2", "--lang", "de"],
            "--lang is for --format easyocr; --format pt2 has no name or language list",
        ),
    ],
)
def test_export_options_that_contradict_each_other_are_one_line_before_anything_runs(options, message, monkeypatch):
    from scripts.export import parse_args

    monkeypatch.setattr(sys, "argv", ["export.py", "best.pt", *options])
    with pytest.raises(ValueError) as raised:
        parse_args()
    assert str(raised.value) == message


@pytest.mark.parametrize("option", ["--tolerance", "--max-accuracy-drop"])
def test_a_nan_threshold_that_would_pass_every_check_is_refused(option, monkeypatch, capsys):
    from scripts.export import parse_args

    monkeypatch.setattr(sys, "argv", ["export.py", "best.pt", "--format", "onnx", option, "nan"])
    with pytest.raises(SystemExit):
        parse_args()
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == f"export.py: error: argument {option}: nan is not a finite number"


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs onnxruntime")
def test_an_onnxruntime_that_fails_to_import_is_not_called_not_installed(tmp_path, monkeypatch):
    from interop.export import onnx_runner

    real_import = builtins.__import__

    def interrupted(name: str, *args, **kwargs):
        if name == "onnxruntime":
            raise ImportError("initialization failed")  # a Ctrl-C while its C extension initialises
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(ImportError, match="initialization failed"):
        onnx_runner(tmp_path / "model.onnx")


# --- predict.py ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mps", "cuda:7", "meta"])
def test_a_device_this_machine_lacks_is_named_with_the_ones_it_has(name):
    from scripts.predict import devices_here, resolve_device

    if name in devices_here() or f"{name}:0" in devices_here():
        pytest.skip(f"this machine has {name}")
    with pytest.raises(ValueError) as raised:
        resolve_device(name)
    assert str(raised.value) == (
        f"--device {name}: not available on this machine; the devices here are "
        f"{', '.join(devices_here())} (or --device auto)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 runs where CUDA is")
def test_fp16_on_the_cpu_is_named_as_the_option_given(tiny_run, tmp_path):
    from scripts.predict import predict

    with pytest.raises(ValueError, match=r"^--precision=fp16 needs a CUDA device; use bf16 or fp32 on the CPU$"):
        predict([], str(tiny_run / "best.pt"), torch.device("cpu"), 8, precision="fp16")


def test_a_beam_of_zero_is_refused_by_name(tiny_run):
    from scripts.predict import predict

    with pytest.raises(ValueError, match=r"^--beam-size 0: must be at least 1$"):
        predict([], str(tiny_run / "best.pt"), torch.device("cpu"), 8, decoder="beam", beam_size=0, precision="fp32")


# --- eval.sh's outputs -------------------------------------------------------------------------------------


def eval_args(monkeypatch, *argv: str) -> argparse.Namespace:
    from scripts.eval import parse_args

    monkeypatch.setattr(sys, "argv", ["eval.py", *argv])
    return parse_args()


@pytest.mark.parametrize(
    "outputs, message",
    [
        (["--json", "{tmp}"], "--json {tmp} is a folder; give a file name"),
        (["--json", "{checkpoint}"], "--json {checkpoint} would overwrite the checkpoint; write it elsewhere"),
        (["--dump", "{val}/data.mdb"], "--dump {val}/data.mdb would overwrite LMDB {val}; write it elsewhere"),
        (
            ["--json", "{tmp}/out.txt", "--dump", "{tmp}/out.txt"],
            "--dump and --json both name {tmp}/out.txt; give each its " "own file",
        ),
    ],
)
def test_eval_outputs_that_would_overwrite_an_input_or_each_other_are_refused_before_evaluating(
    outputs, message, tiny_run, synth, tmp_path, monkeypatch
):
    from scripts.eval import check_args

    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes((tiny_run / "best.pt").read_bytes())
    names = {"tmp": tmp_path, "checkpoint": checkpoint, "val": synth / "val"}
    args = eval_args(monkeypatch, str(checkpoint), str(synth / "val"), *[part.format(**names) for part in outputs])
    with pytest.raises(ValueError) as raised:
        check_args(args)
    assert str(raised.value) == message.format(**names)
    assert checkpoint.read_bytes() == (tiny_run / "best.pt").read_bytes()


def test_a_negative_worker_count_is_named_as_the_option(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        eval_args(monkeypatch, "best.pt", "lmdb", "--workers", "-1")
    assert capsys.readouterr().err.splitlines()[-1] == (
        "eval.py: error: argument --workers: -1 is below 0 (0 reads in " "the main process)"
    )


def test_a_results_file_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    results = tmp_path / "results.json"
    write_text_atomically(results, json.dumps({"accuracy": 0.5}))

    def stopped(descriptor: int) -> None:
        raise cli.Stopped(signal.SIGINT)  # a Ctrl-C while the file is written

    monkeypatch.setattr(os, "fsync", stopped)
    with pytest.raises(cli.Stopped):
        write_text_atomically(results, json.dumps({"accuracy": 0.9}))
    assert json.loads(results.read_text()) == {"accuracy": 0.5}
    assert [path.name for path in tmp_path.iterdir()] == ["results.json"]


# --- import_weights.py ---------------------------------------------------------------------------------------


def test_import_weights_never_replaces_a_trained_checkpoint_or_names_a_temporary_file(tiny_run, tmp_path):
    from scripts.import_weights import check_out

    source = tmp_path / "crnn.pth"
    trained = tmp_path / "best.pt"
    trained.write_bytes((tiny_run / "best.pt").read_bytes())
    with pytest.raises(
        ValueError,
        match=r"^--out .*best.pt exists and is not a checkpoint this script wrote \(a "
        r"trained checkpoint would be lost\); remove it or give another --out$",
    ):
        check_out(trained, source)
    with pytest.raises(ValueError) as raised:
        check_out(tmp_path, source)
    assert str(raised.value) == f"--out {tmp_path} is a folder; give a file, e.g. --out {tmp_path / 'crnn.pt'}"
    earlier = tmp_path / "imported.pt"
    save_checkpoint(earlier, {"model": {"w": torch.ones(1)}, "imported_from": {"format": "dtrb", "file": "x.pth"}})
    check_out(earlier, source)  # an earlier import is replaced, as the same command run again does
    check_out(tmp_path / "new.pt", source)
