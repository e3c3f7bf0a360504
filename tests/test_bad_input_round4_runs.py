"""Bad input, round 4: the run folder's files are what they are named. A symbolic link in a run folder (to a
file, or to another tool's folder) is never followed, overwritten or deleted: the run refuses with one line
naming it; train.overwrite=true deletes only what a run of this project wrote, and names what it kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import one_line_error, train_small

from training.config import ConfigError
from training.run_folder import clear_run_folder, lock_run_folder, unlock_run_folder
from training.run_log import RunLog
from utils.run_files import LinkInRunFolder


def contents(path: Path) -> object:
    return sorted((p.name, p.read_bytes()) for p in path.iterdir()) if path.is_dir() else path.read_bytes()


LINKED = ["metrics.jsonl", "best.pt", "config.yaml", ".lock", "tensorboard", "ckpt-0000004.pt"]


@pytest.mark.parametrize("name", LINKED)
def test_a_link_in_the_run_folder_is_refused_by_train_and_its_target_left_untouched(synth, tiny_run, tmp_path, name):
    out_dir = tmp_path / "run"
    shutil.copytree(tiny_run, out_dir)
    elsewhere = tmp_path / "elsewhere"
    if name == "tensorboard":
        elsewhere.mkdir()
        (elsewhere / "other-tool.log").write_text("another tool's log\n")
        shutil.rmtree(out_dir / name)
    else:
        elsewhere.write_text("someone's own file\n")
        (out_dir / name).unlink(missing_ok=True)
    before = contents(elsewhere)
    (out_dir / name).symlink_to(elsewhere)
    # tiny_run's run, continued: without the check, train.py would resume it and write through the link
    steps = ("train.max_steps=6", "train.eval_every=6", "train.log_every=2", "train.tensorboard=true")
    steps = (*steps, "data.augment=strong")
    for extra in ((), ("train.overwrite=true",)):
        result = train_small(synth, out_dir, *steps, *extra)
        assert contents(elsewhere) == before, result.stderr[-2000:]
        error = one_line_error(result, f"{out_dir / name} is a symbolic link (to {elsewhere})", "remove the link")
        assert "pick another train.out_dir" in error
        assert (out_dir / name).is_symlink()


def test_metrics_and_lock_are_opened_without_following_a_link_made_after_start_up(tmp_path):
    target = tmp_path / "bashrc"
    target.write_text("export PATH=...\n")
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "metrics.jsonl").symlink_to(target)
    with pytest.raises(LinkInRunFolder, match=r"metrics.jsonl is a symbolic link \(to .*bashrc\)"):
        RunLog(out_dir).metrics({"step": 100, "loss": 1.0})
    (out_dir / ".lock").symlink_to(target)
    with pytest.raises(ConfigError, match=r"\.lock is a symbolic link"):
        lock_run_folder(out_dir)
    assert target.read_text() == "export PATH=...\n"
    (out_dir / ".lock").unlink()
    lock, _ = lock_run_folder(out_dir)  # a real file: locked as before
    unlock_run_folder(lock)


def test_overwrite_deletes_only_what_a_run_wrote_and_names_what_it_kept(synth, tiny_run, tmp_path):
    out_dir = tmp_path / "run"
    shutil.copytree(tiny_run, out_dir)
    (out_dir / "notes.txt").write_text("my notes\n")
    (out_dir / "tensorboard" / "other-tool.log").write_text("another tool's log\n")
    assert list((out_dir / "tensorboard").glob("events.out.tfevents.*"))
    said: list[str] = []
    kept = clear_run_folder(out_dir, said.append)
    assert sorted(p.name for p in kept) == ["notes.txt", "other-tool.log"]
    assert (out_dir / "notes.txt").read_text() == "my notes\n"
    assert (out_dir / "tensorboard" / "other-tool.log").read_text() == "another tool's log\n"
    assert not list((out_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert not [p for p in out_dir.iterdir() if p.suffix in (".pt", ".jsonl", ".yaml")]
    assert len(said) == 1 and "kept what this project did not write: notes.txt, tensorboard/other-tool.log" in said[0]


def test_train_overwrite_keeps_a_users_notes_and_says_so(synth, tiny_run, tmp_path):
    out_dir = tmp_path / "run"
    shutil.copytree(tiny_run, out_dir)
    (out_dir / "notes.txt").write_text("my notes\n")
    (out_dir / "tensorboard" / "other-tool.log").write_text("another tool's log\n")
    steps = ("train.max_steps=2", "train.eval_every=2", "train.log_every=2", "train.overwrite=true")
    result = train_small(synth, out_dir, *steps, check=True)
    said = result.stdout + result.stderr
    assert "kept what this project did not write: notes.txt, tensorboard/other-tool.log" in said
    assert (out_dir / "notes.txt").read_text() == "my notes\n"
    assert (out_dir / "tensorboard" / "other-tool.log").exists()
    assert (out_dir / "best.pt").is_file() and (out_dir / "config.yaml").is_file()
