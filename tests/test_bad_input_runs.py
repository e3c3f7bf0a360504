"""Round 3 of bad input (issue 28) on runs: a checkpoint given by path is checked against the run, best.pt
means what it says, and nothing is lost or left behind in a run folder (docs/bad-input.md, its section
"Round 3: checkpoints, best.pt and run folders")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TORCHRUN_TWO_UNTIL_EACH_FAILS, run_command
from conftest import train_small as train

from models import model_from_config
from training.checkpoint import check_config, load_checkpoint, load_initial_weights, save_checkpoint
from training.config import ConfigError, load_config, validate
from training.run_folder import find_latest_checkpoint, lock_run_folder, unlock_run_folder
from utils.atomic_write import write_text_atomically


def copy_run(tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of the session's 4-step run that a test may change."""
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def small_config(*overrides: str):
    return load_config("crnn.yaml", ["model.hidden_size=32", *overrides])


# B. A checkpoint given by path is checked against the run.


@pytest.mark.slow
def test_resume_from_another_folder_drives_the_schedule_with_the_new_lr(synth, tiny_run, tmp_path):
    """The optimizer state comes from the checkpoint, its hyperparameters from the config: the old code
    logged optim.lr=0.01 and kept the checkpoint's rate (the scheduler's saved base)."""
    result = train(
        synth,
        tmp_path / "new",
        f"train.resume={tiny_run / 'last.pt'}",
        "optim.lr=0.01",
        "train.max_steps=6",
        "train.log_every=2",
        "train.eval_every=6",
        f"data.train=[{synth / 'test'}]",
    )
    assert result.returncode == 0, result.stderr
    recipe = load_config("crnn.yaml", []).optim
    assert "changed on resume (this run's values apply):\n" in result.stdout
    assert f"\n  optim.lr: {recipe.lr} -> 0.01\n" in result.stdout
    assert f"\n  data.train: ['{synth / 'train'}'] -> ['{synth / 'test'}']\n" in result.stdout
    assert "warning: data.train now has [20] usable samples, not [96]" in result.stdout
    records = [json.loads(line) for line in (tmp_path / "new" / "metrics.jsonl").read_text().splitlines()]
    [lr] = [record["lr"] for record in records if record.get("step") == 6 and "lr" in record]
    assert lr == pytest.approx(0.01 * 7 / recipe.warmup_steps)  # the 7th lr of the warm-up


@pytest.mark.slow
def test_a_checkpoint_with_another_model_is_refused_naming_the_key_by_resume_and_init_from(tiny_run, tmp_path):
    checkpoint = load_checkpoint(tiny_run / "last.pt")
    for option in ("train.resume", "train.init_from"):
        with pytest.raises(
            ConfigError,
            match=f"{option}=.*its weights were trained for another model .*\n"
            f"  model.hidden_size: 32 -> 48\nset these keys as the checkpoint",
        ):
            check_config(checkpoint, tiny_run / "last.pt", small_config("model.hidden_size=48"), option)
    with pytest.raises(ConfigError, match="model.channels: .* -> \\[16, 32, 64, 64, 64, 64, 64\\]"):
        check_config(checkpoint, "x.pt", small_config("model.channels=[16,32,64,64,64,64,64]"), "train.init_from")
    with pytest.raises(ConfigError, match="data.img_height: 32 -> 48"):
        check_config(checkpoint, "x.pt", small_config("data.img_height=48"), "train.resume")


@pytest.mark.slow
def test_resume_refuses_another_optimizer_and_init_from_takes_it_with_another_alphabet(tiny_run, tmp_path):
    """The optimizer state belongs to its optimizer; init_from starts a new one, and matches the
    classifier's rows by character."""
    path = tiny_run / "last.pt"
    adadelta = small_config("optim.name=adadelta", "optim.lr=1.0", "data.alphabet=abc")
    with pytest.raises(
        ConfigError,
        match="its optimizer state belongs to another optimizer .*\n  optim.name: 'adam'"
        " -> 'adadelta'\nset it back to continue that run, or start a new run from "
        f"its weights with train.init_from={path}",
    ):
        check_config(load_checkpoint(path), path, adadelta, "train.resume")
    model = model_from_config(adadelta.model, 4)
    report = load_initial_weights(model, path, "abc", adadelta)
    tensors = len(model.state_dict())
    assert f"loaded {tensors} of {tensors} tensors" in report
    assert "this run's config, not the checkpoint's: " in report
    assert "data.alphabet: '0123456789abcdefghijklmnopqrstuvwxyz' -> 'abc'" in report
    assert "optim.name: 'adam' -> 'adadelta'" in report


@pytest.mark.slow
def test_a_checkpoint_of_an_older_version_missing_new_keys_is_compared_with_their_defaults(tiny_run):
    checkpoint = load_checkpoint(tiny_run / "last.pt")
    del checkpoint["config"]["data"]["interpolation"], checkpoint["config"]["model"]["sync_bn"]
    changes = check_config(checkpoint, "old.pt", small_config(), "train.resume")
    assert not any(change.startswith(("data.interpolation", "model.")) for change in changes)
    # An architecture's own settings (model.*) read as its constructor's defaults where left out, on either side:
    # a checkpoint from before crnn.yaml took model.pool_before_norm ran with the paper's layout, `false`.
    for setting in ("cnn_shortcut", "pool_before_norm", "strided_stem"):
        del checkpoint["config"]["model"][setting]
    with pytest.raises(
        ConfigError,
        match=r"\n  model.cnn_shortcut: False -> True\n  model.pool_before_norm: False -> True\n"
        r"  model.strided_stem: False -> True\nset these keys",
    ):
        check_config(checkpoint, "old.pt", small_config(), "train.init_from")
    paper_layout = ("model.cnn_shortcut=false", "model.pool_before_norm=false", "model.strided_stem=false")
    changes = check_config(checkpoint, "old.pt", small_config(*paper_layout), "train.init_from")
    assert not any(change.startswith("model.") for change in changes)
    checkpoint["config"]["model"]["strided_stem"] = True
    config_without_the_key = small_config(*paper_layout[:2])
    del config_without_the_key.model.settings["strided_stem"]
    with pytest.raises(ConfigError, match=r"\n  model.strided_stem: True -> False\nset these keys"):
        check_config(checkpoint, "old.pt", config_without_the_key, "train.init_from")


def test_init_from_a_bare_state_dict_of_another_architecture_is_refused(tmp_path):
    """Before: 'loaded 1 of 62 tensors' and a run from scratch under the checkpoint's name."""
    source = model_from_config(small_config("model.channels=[16,32,64,64,64,64,64]").model, 37)
    save_checkpoint(tmp_path / "bare.pt", source.state_dict())  # no config, no alphabet: nothing to compare
    target = model_from_config(small_config().model, 37)
    with pytest.raises(
        ConfigError,
        match=r"train.init_from=.*bare.pt: \d+ of the model's \d+ tensors outside the "
        r"classifier are missing from it or of another shape \(backbone\.",
    ):
        load_initial_weights(target, tmp_path / "bare.pt", "0123456789abcdefghijklmnopqrstuvwxyz")


# C. best.pt means what it says.


def test_an_empty_data_val_is_refused():
    with pytest.raises(ConfigError, match="data.val is empty: list at least one LMDB folder to validate on"):
        validate(load_config("crnn.yaml", ["data.val=[]"]))


@pytest.mark.slow
def test_a_changed_data_val_on_resume_restarts_the_best_score_and_the_report_names_the_new_sets(
    synth, tiny_run, tmp_path
):
    run = copy_run(tiny_run, tmp_path)
    (run / "best.pt").unlink()
    torch.save({**load_checkpoint(tiny_run / "best.pt"), "accuracy": 1.0}, run / "best.pt")
    for name in ("last.pt", "ckpt-0000004.pt"):  # an old set whose best score no new one can beat
        checkpoint = load_checkpoint(run / name)
        torch.save({**checkpoint, "best_accuracy": 1.0}, run / name)
    result = train(
        synth,
        run,
        f"data.val=[{synth / 'test'}]",
        "train.max_steps=6",
        "train.eval_every=6",
        "train.log_every=6",
        "data.augment=strong",
    )
    assert result.returncode == 0, result.stderr
    assert (
        f"best val accuracy 1.0000 was measured on data.val ['{synth / 'val'}']; this run validates on "
        f"['{synth / 'test'}']: the best score starts afresh"
    ) in result.stdout
    best = load_checkpoint(run / "best.pt")
    assert best["step"] == 6 and best["accuracy"] < 1.0
    assert f"best val accuracy {best['accuracy']:.4f} on data.val ['{synth / 'test'}']" in result.stdout


# G. Nothing lost, nothing left behind.


@pytest.mark.slow
def test_resume_with_another_model_stops_both_torchrun_ranks_before_anything_is_written(synth, tiny_run, tmp_path):
    result = train(
        synth,
        tmp_path / "new",
        f"train.resume={tiny_run / 'last.pt'}",
        "model.hidden_size=48",
        launcher=TORCHRUN_TWO_UNTIL_EACH_FAILS,
    )
    assert result.returncode != 0
    assert (
        result.stderr.count(
            f"error: train.resume={tiny_run / 'last.pt'}: its weights were trained for another "
            f"model (checkpoint -> this run):"
        )
        == 2
    )  # every rank: none waits for the other
    assert result.stderr.count("  model.hidden_size: 32 -> 48") == 2
    assert not (tmp_path / "new" / "config.yaml").exists()


@pytest.mark.slow
def test_overwrite_with_a_bad_init_from_keeps_the_old_run(synth, tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path)
    before = sorted(path.name for path in run.iterdir())
    result = train(synth, run, "train.overwrite=true", f"train.init_from={tmp_path / 'typo.pt'}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"error: checkpoint {tmp_path / 'typo.pt'} does not exist"
    assert sorted(path.name for path in run.iterdir()) == before
    load_checkpoint(run / "last.pt")


def test_the_next_start_removes_what_a_killed_writer_left_and_only_that(tmp_path):
    leftovers = [".ckpt-0000250.pt.k2j4_x9a.tmp", ".best.pt.abcdefgh.tmp", ".config.yaml.4242.tmp", ".last.pt.4242.tmp"]
    kept = ["notes.tmp", ".tmp", "ckpt-0000250.pt", ".hidden"]
    for name in leftovers + kept:
        (tmp_path / name).write_bytes(b"half")
    lock, removed = lock_run_folder(tmp_path)
    unlock_run_folder(lock)
    assert sorted(path.name for path in removed) == sorted(leftovers)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(kept)


@pytest.mark.slow
def test_a_second_run_in_a_busy_folder_is_refused_on_every_rank_naming_the_first(synth, tmp_path):
    """Both torchrun ranks stop with rank 0's refusal, before anything is written; the kernel's lock
    dies with its holder, so the .lock a killed run left blocks nothing, and a run that ends removes it."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    lock, _ = lock_run_folder(out_dir)  # the first run: this test's process
    try:
        result = train(
            synth,
            out_dir,
            "train.max_steps=2",
            launcher=TORCHRUN_TWO_UNTIL_EACH_FAILS,
        )
    finally:
        lock.file.close()  # as the kernel does when its process dies: the file stays
    line = (
        f"error: train.out_dir={out_dir} is in use by another run (PID {os.getpid()} on host "
        f"{os.uname().nodename}); wait for it to end, stop it, or pick another train.out_dir"
    )
    assert result.returncode != 0 and result.stderr.count(line) == 2
    assert sorted(path.name for path in out_dir.iterdir()) == [".lock"]
    assert f"PID {os.getpid()}" in (out_dir / ".lock").read_text()  # a stale record, and no lock behind it
    lock, _ = lock_run_folder(out_dir)
    unlock_run_folder(lock)
    assert not any(out_dir.iterdir())


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_checkpoints_and_run_files_get_the_permissions_of_the_umask(tmp_path, umask, mode):
    """Not mkstemp's 0600: a colleague on a shared server reads the model as any file the user writes."""
    previous = os.umask(umask)
    try:
        save_checkpoint(tmp_path / "best.pt", {"model": {}})
        write_text_atomically(tmp_path / "config.yaml", "a: 1\n")
    finally:
        os.umask(previous)
    assert [(tmp_path / name).stat().st_mode & 0o777 for name in ("best.pt", "config.yaml")] == [mode, mode]


# Own cases: resume, checkpoints and plot.py.


@pytest.mark.slow
def test_a_run_whose_numbered_checkpoints_were_deleted_resumes_from_last_pt(tiny_run, tmp_path):
    """Before: resume=auto found no ckpt-*.pt, started from step 0 and overwrote last.pt and best.pt."""
    run = copy_run(tiny_run, tmp_path)
    for path in run.glob("ckpt-*.pt"):
        path.unlink()
    path, checkpoint = find_latest_checkpoint(run, warn=pytest.fail)
    assert path == run / "last.pt" and checkpoint["step"] == 4


@pytest.mark.slow
def test_a_finished_run_started_again_says_done_and_one_asked_to_end_before_its_step_is_refused(
    synth, tiny_run, tmp_path
):
    """The same command again is the way to continue a run: once it has finished, that says done.
    A train.max_steps below the checkpoint's step gave the same 'done: step 4', exit 0, nothing saved."""
    run = copy_run(tiny_run, tmp_path)
    result = train(synth, run, "train.max_steps=4", "data.augment=strong")
    assert result.returncode == 0 and "done: step 4, best val accuracy" in result.stdout
    result = train(synth, tmp_path / "new", f"train.resume={tiny_run / 'last.pt'}", "train.max_steps=3")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: train.max_steps=3: {tiny_run / 'last.pt'} is at step 4 already; set train.max_steps above 4 to "
        f"train it further"
    )
    assert not (tmp_path / "new" / "config.yaml").exists()


def plot(run: Path, *options: str) -> subprocess.CompletedProcess:
    return run_command(sys.executable, "scripts/plot.py", run, *options, timeout=120)


@pytest.mark.slow
def test_plot_draws_a_diverged_run_and_a_log_holding_text_where_numbers_belong(tmp_path):
    """Before: 'error: cannot convert float NaN to integer' for a NaN loss; tracebacks for null or text."""
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 2, "loss": "x", "lr": null, "images_per_s": "fast", "infinite_losses": "x"}\n'
        '{"step": 4, "val": "v", "accuracy": "high"}\n{"step": 6, "val": "v", "accuracy": 0.5, "cer": null}\n'
        '{"step": 8, "loss": NaN, "lr": 0.001, "images_per_s": 100.4}\n'
    )
    result = plot(tmp_path, "--out", str(tmp_path / "a.png"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "a.png").stat().st_size > 0
    from scripts.plot import load_records, short_names, summary

    records = load_records(tmp_path / "metrics.jsonl")
    lines = summary(records, short_names(list(records.val)), tmp_path)
    assert "last step 8: loss nan, lr 0.001, 100 images/s" in lines


@pytest.mark.slow
def test_plot_names_a_metrics_log_that_is_a_folder_and_an_out_path_below_a_file(tiny_run, tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    result = plot(tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: {tmp_path / 'metrics.jsonl'} is a folder, not the run's log; is {tmp_path}" f" a run folder?"
    )
    (tmp_path / "file").write_text("x")
    result = plot(tiny_run, "--out", str(tmp_path / "file" / "curves.png"))
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
        f"error: {tmp_path / 'file'}: File exists; something else is already there"
    )


def test_a_run_folder_the_lock_created_is_removed_again_when_nothing_was_written(tmp_path):
    """The lock needs its folder, and a start that fails must leave none behind: the folders the lock
    made are removed at unlock while empty, those holding anything (or existing before) are kept."""
    lock, _ = lock_run_folder(tmp_path / "runs" / "new")
    assert (tmp_path / "runs" / "new" / ".lock").exists()
    unlock_run_folder(lock)
    assert not any(tmp_path.iterdir())
    lock, _ = lock_run_folder(tmp_path / "runs" / "used")
    (tmp_path / "runs" / "used" / "config.yaml").write_text("x")
    unlock_run_folder(lock)
    assert [path.name for path in (tmp_path / "runs" / "used").iterdir()] == ["config.yaml"]


@pytest.mark.slow
def test_a_best_pt_already_in_the_folder_is_replaced_only_by_a_better_score(synth, tiny_run, tmp_path):
    """A run killed before its first checkpoint leaves config.yaml and best.pt; the next start begins
    afresh, and its first validations (a 4-step model) must not put worse weights under best.pt's name.
    The same holds for a resume from an older checkpoint than the one best.pt was saved at."""
    out_dir = copy_run(tiny_run, tmp_path)
    for path in out_dir.glob("*.pt"):
        if path.name != "best.pt":
            path.unlink()
    best = load_checkpoint(out_dir / "best.pt")
    save_checkpoint(out_dir / "best.pt", {**best, "accuracy": 0.99})
    kept = (out_dir / "best.pt").read_bytes()
    result = train(
        synth, out_dir, "train.max_steps=4", "train.eval_every=4", "train.log_every=4", "data.augment=strong"
    )
    assert result.returncode == 0, result.stderr
    assert f"{out_dir / 'best.pt'} scores 0.9900 on data.val; a validation must beat it to replace it" in result.stdout
    assert (out_dir / "best.pt").read_bytes() == kept and (out_dir / "last.pt").is_file()
