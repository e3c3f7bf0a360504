"""train.init_alphabet: a fine-tune's alphabet, `new` (data.alphabet's, the checkpoint's rows moved by character)
or `union` (the checkpoint's, every row in its place, then data.alphabet's new characters); said at start-up,
recorded in the run's checkpoints so that a resume and eval read it without the train.init_from file. Across
the README's model (tiny_run's crnn.yaml) and an imported one (a small english_g2, finetune_easyocr.yaml)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from data.lmdb_writer import write_lmdb
from interop.peer_weights import EASYOCR_ENGLISH_G2
from models import model_from_config
from tests.conftest import ALPHABET, SMALL_RUN, read_lmdb, run_command
from tests.test_peer_weights import dtrb_state_dict, import_weights
from training.alphabet_policy import run_alphabet, union_alphabet
from training.checkpoint import classifier_keys, load_checkpoint, load_initial_weights
from training.config import ConfigError, load_config, validate

G2_LOWERCASED = "".join(char for char in EASYOCR_ENGLISH_G2 if char.lower() == char)


def fine_tune_config(start, *overrides: str):
    return load_config("crnn.yaml", [*SMALL_RUN, f"train.init_from={start}", *overrides])


def start_of(start, *overrides: str) -> tuple[str, str, dict, dict]:
    """The run's alphabet, init_from's report, the model's weights as built and as loaded, for a fine-tune of
    `start` with `overrides`: what train.py's start does, in this process."""
    config = fine_tune_config(start, *overrides)
    alphabet = run_alphabet(config)
    torch.manual_seed(0)
    model = model_from_config(config.model, len(alphabet) + 1)
    built = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    report = load_initial_weights(model, start, alphabet, config)
    return alphabet, report, built, model.state_dict()


def test_union_keeps_every_row_in_its_place_and_adds_the_new_characters(checkpoint):
    alphabet, report, built, loaded = start_of(checkpoint, "train.init_alphabet=union", "data.alphabet=!ab-")
    assert alphabet == ALPHABET + "!-"
    assert "characters (train.init_alphabet=union): kept 36 of the checkpoint's 36; added 2: '!-'; dropped 0" in report
    source = load_checkpoint(checkpoint)["model"]
    classifier = classifier_keys(loaded, len(alphabet) + 1)
    assert classifier  # the BiLSTM's projection and the cnn_shortcut
    for key in classifier:
        assert torch.equal(loaded[key][: len(ALPHABET) + 1], source[key])  # the blank and 36 rows, bit for bit
        assert torch.equal(loaded[key][len(ALPHABET) + 1 :], built[key][len(ALPHABET) + 1 :])  # new: as built


def test_new_with_a_smaller_alphabet_drops_the_other_characters_and_says_which(checkpoint):
    alphabet, report, _, loaded = start_of(checkpoint, "data.alphabet=zab")
    assert alphabet == "zab"
    assert (
        "characters (train.init_alphabet=new): kept 3 of the checkpoint's 36; added 0; dropped 33: "
        "'0123456789cdefghijklmnopqrstuvwxy'"
    ) in report
    source = load_checkpoint(checkpoint)["model"]
    for key in classifier_keys(loaded, len(alphabet) + 1):
        for row, char in enumerate("zab", start=1):
            assert torch.equal(loaded[key][row], source[key][ALPHABET.index(char) + 1])


def test_the_policy_is_a_choice_and_union_needs_a_checkpoint_to_extend():
    config = load_config("crnn.yaml", ["train.init_alphabet=both"])
    with pytest.raises(ConfigError, match="train.init_alphabet: 'both' is not one of new, union"):
        validate(config)
    with pytest.raises(ConfigError, match="train.init_from is empty: set it, or set train.init_alphabet=new"):
        run_alphabet(load_config("crnn.yaml", ["train.init_alphabet=union"]))


def test_a_resumed_union_run_reads_its_recorded_alphabet_which_must_hold_data_alphabets(tmp_path):
    config = fine_tune_config(tmp_path / "gone.pt", "train.init_alphabet=union", "data.alphabet=ab!")
    recorded = ALPHABET + "!"
    assert run_alphabet(config, ("last.pt", {"alphabet": recorded})) == recorded
    config.data.alphabet = "ab!?"
    with pytest.raises(ConfigError, match=r"last.pt reads 37 characters, and data.alphabet has 1 it lacks \('\?'\)"):
        run_alphabet(config, ("last.pt", {"alphabet": recorded}))


def test_union_under_fold_case_leaves_out_the_capitals_no_label_holds():
    assert union_alphabet(EASYOCR_ENGLISH_G2, ALPHABET + "é", folds_case=False) == EASYOCR_ENGLISH_G2 + "é"
    assert union_alphabet(EASYOCR_ENGLISH_G2, ALPHABET + "é", folds_case=True) == G2_LOWERCASED + "é"
    assert len(G2_LOWERCASED) == 96 - 26


def fine_tune(config: str, *overrides: object) -> str:
    """train.py's log of a SMALL_RUN with `config`, then `overrides`."""
    command = ("train.py", "--config", config, *SMALL_RUN, "train.log_every=1", *overrides)
    result = run_command(sys.executable, *command, check=True)
    return result.stdout + result.stderr


@pytest.mark.slow  # starts real processes
def test_a_union_run_resumes_without_its_start_and_eval_reads_its_alphabet(checkpoint, synth, tmp_path):
    start = tmp_path / "start.pt"
    shutil.copy(checkpoint, start)
    marked = tmp_path / "marked"  # every label ends in a character the start does not read
    write_lmdb(marked, [(image, label + "!") for image, label in read_lmdb(synth / "val")])
    out_dir = tmp_path / "run"
    run = (
        f"data.train=[{marked}]",
        f"data.val=[{marked}]",
        f"train.out_dir={out_dir}",
        f"train.init_from={start}",
        "train.init_alphabet=union",
        "data.alphabet=!abc",  # under `new`, labels holding other characters would be dropped
        "data.unknown_characters=drop",
        "train.eval_every=2",
    )
    log = fine_tune("crnn.yaml", *run, "train.max_steps=2")
    assert "characters (train.init_alphabet=union): kept 36 of the checkpoint's 36; added 1: '!'; dropped 0" in log
    assert f"{marked}: kept 33 of 33; dropped: none" in log  # the label index reads the union
    union = ALPHABET + "!"
    assert load_checkpoint(out_dir / "best.pt")["alphabet"] == union
    assert load_checkpoint(out_dir / "last.pt")["alphabet"] == union

    start.unlink()  # a resume reads the alphabet the run's checkpoint recorded
    log = fine_tune("crnn.yaml", *run, "train.max_steps=4")
    assert f"resumed from {out_dir / 'ckpt-0000002.pt'} at step 2" in log
    resumed = load_checkpoint(out_dir / "last.pt")
    assert resumed["step"] == 4 and resumed["alphabet"] == union

    results = tmp_path / "eval.json"
    command = ("scripts/eval.py", out_dir / "best.pt", marked, "--unknown-characters", "drop", "--json", results)
    run_command(sys.executable, *command, "--precision", "fp32", "--workers", "0", check=True)
    assert json.loads(results.read_text())["sets"][0]["samples"] == 33  # none left out: '!' is a character


@pytest.mark.slow  # starts real processes
def test_an_imported_english_g2_starts_under_either_policy(synth, tmp_path):
    torch.save(dtrb_state_dict(channels=64, hidden=16, classes=len(EASYOCR_ENGLISH_G2) + 1), tmp_path / "g2.pth")
    assert import_weights(tmp_path / "g2.pth", tmp_path / "g2.pt").returncode == 0
    run = (
        f"data.train=[{synth / 'train'}]",
        "data.train_ratios=[]",
        f"data.val=[{synth / 'val'}]",
        f"train.init_from={tmp_path / 'g2.pt'}",
        "model.channels=64",
        "model.hidden_size=16",
        "data.img_width=128",
        "train.batch_size=4",
        "train.max_steps=1",
        "train.eval_every=1",
        "train.max_minutes=null",
        f"data.alphabet={ALPHABET}é",
    )
    # finetune_easyocr.yaml's model keys are english_g2's (at the import's small widths); data.fold_case=true
    log = fine_tune("finetune_easyocr.yaml", *run, f"train.out_dir={tmp_path / 'union'}", "train.init_alphabet=union")
    assert "loaded 44 of 44 tensors" in log
    assert (
        "characters (train.init_alphabet=union): kept 70 of the checkpoint's 96; added 1: 'é'; dropped 26: "
        "'ABCDEFGHIJKLMNOPQRSTUVWXYZ' (data.fold_case=true: no lowercased label holds them)"
    ) in log
    assert load_checkpoint(tmp_path / "union" / "last.pt")["alphabet"] == G2_LOWERCASED + "é"

    log = fine_tune("finetune_easyocr.yaml", *run, f"train.out_dir={tmp_path / 'new'}")
    assert "characters (train.init_alphabet=new): kept 36 of the checkpoint's 96; added 1: 'é'; dropped 60: " in log
    assert load_checkpoint(tmp_path / "new" / "last.pt")["alphabet"] == ALPHABET + "é"
