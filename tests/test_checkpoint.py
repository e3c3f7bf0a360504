from __future__ import annotations

import argparse
import collections

import pytest
import torch

from models import model_from_config
from training.checkpoint import (
    load_checkpoint,
    load_initial_weights,
    load_model,
    save_checkpoint,
    strip_wrapper_prefixes,
)
from training.config import load_config, to_dict

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def small_config(alphabet: str = ALPHABET):
    return load_config("crnn.yaml", ["model.hidden_size=32", f"data.alphabet={alphabet}"])


def small_model(alphabet: str = ALPHABET) -> torch.nn.Module:
    torch.manual_seed(0)
    return model_from_config(small_config(alphabet).model, len(alphabet) + 1)  # what its checkpoints record


def test_round_trip_loads_with_weights_only_and_strict(tmp_path):
    model, config = small_model(), small_config()
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"model": model.state_dict(), "config": to_dict(config), "alphabet": ALPHABET, "step": 3})
    raw = torch.load(path, weights_only=True)
    assert raw["step"] == 3 and not any(k.startswith(("module.", "_orig_mod.")) for k in raw["model"])
    loaded, codec, loaded_config, _ = load_model(path, "cpu")
    assert codec.alphabet == ALPHABET and loaded_config == config and not loaded.training
    images = torch.randn(2, 1, 32, 100)
    model.eval()
    torch.testing.assert_close(loaded(images), model(images))
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed into place


def test_prefixed_bare_state_dict_loads_with_a_config(tmp_path):
    model, config = small_model(), small_config()
    prefixed = collections.OrderedDict(("module._orig_mod." + k, v) for k, v in model.state_dict().items())
    path = tmp_path / "dataparallel.pth"
    torch.save(prefixed, path)
    with pytest.raises(ValueError, match="--config"):
        load_model(path, "cpu")
    loaded, _, _, _ = load_model(path, "cpu", config)
    assert loaded.state_dict().keys() == model.state_dict().keys()


def test_strip_wrapper_prefixes():
    state = {"module.a": 1, "_orig_mod.b": 2, "_orig_mod.module.c": 3, "d.module.e": 4}
    assert strip_wrapper_prefixes(state) == {"a": 1, "b": 2, "c": 3, "d.module.e": 4}


def test_checkpoint_for_another_alphabet_is_a_clear_error(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(
        path, {"model": small_model("abc").state_dict(), "config": to_dict(small_config()), "alphabet": ALPHABET}
    )
    with pytest.raises(ValueError, match="another alphabet or architecture"):
        load_model(path, "cpu")


def test_init_from_a_checkpoint_without_an_alphabet_leaves_the_classifier_fresh(tmp_path):
    """Its rows cannot be matched to characters, whether or not their number fits."""
    for source_alphabet in ("abc", ALPHABET):
        path = tmp_path / "ckpt.pt"
        source = small_model(source_alphabet)
        save_checkpoint(path, {"model": source.state_dict()})  # a bare state dict: no alphabet
        target = small_model(ALPHABET)
        torch.manual_seed(1)
        target.sequence[-1].linear.reset_parameters()
        target.shortcut.reset_parameters()
        fresh, fresh_shortcut = target.sequence[-1].linear.weight.clone(), target.shortcut.weight.clone()
        report = load_initial_weights(target, path, alphabet=ALPHABET)
        last = f"sequence.{len(target.sequence) - 1}.linear"
        # crnn.yaml's model has two linear layers onto the classes: the BiLSTM's projection and the cnn_shortcut.
        classifier = f"{last}.weight, {last}.bias, shortcut.weight, shortcut.bias"
        assert f"{classifier}: fresh; the checkpoint records no alphabet" in report
        torch.testing.assert_close(target.sequence[-1].linear.weight, fresh)
        torch.testing.assert_close(target.shortcut.weight, fresh_shortcut)
        torch.testing.assert_close(target.backbone[0].weight, source.backbone[0].weight)


def test_init_from_another_alphabet_keeps_the_rows_of_shared_characters(tmp_path):
    path = tmp_path / "ckpt.pt"
    source = small_model("abcxyz")
    save_checkpoint(path, {"model": source.state_dict(), "alphabet": "abcxyz"})
    torch.manual_seed(1)
    target = model_from_config(small_config("zqa").model, len("zqa") + 1)
    fresh_q = target.sequence[-1].linear.weight[2].clone()
    report = load_initial_weights(target, path, alphabet="zqa")
    assert (
        "rows matched by character: 1 copied in place (the blank included), 2 moved, 1 new characters initialised"
        " fresh\n  characters: kept 2 of the checkpoint's 6; added 1: 'q'; dropped 4: 'bcxy'"
    ) in report
    assert "re-initialised" not in report
    for new, old in [(target.sequence[-1].linear, source.sequence[-1].linear), (target.shortcut, source.shortcut)]:
        for new_row, old_row in [(0, 0), (1, 6), (3, 1)]:  # blank; z: 6th of abcxyz; a: 1st
            torch.testing.assert_close(new.weight[new_row], old.weight[old_row])
            torch.testing.assert_close(new.bias[new_row], old.bias[old_row])
    torch.testing.assert_close(target.sequence[-1].linear.weight[2], fresh_q)  # q is new: left as initialised


def test_init_from_a_reordered_alphabet_of_the_same_size_moves_rows_by_character(tmp_path):
    path = tmp_path / "ckpt.pt"
    source = small_model("abc")
    save_checkpoint(path, {"model": source.state_dict(), "alphabet": "abc"})
    target = small_model("cba")
    report = load_initial_weights(target, path, alphabet="cba")
    tensors = len(target.state_dict())
    assert f"loaded {tensors} of {tensors} tensors" in report
    assert "2 copied in place (the blank included), 2 moved, 0 new characters" in report
    for new, old in [(target.sequence[-1].linear, source.sequence[-1].linear), (target.shortcut, source.shortcut)]:
        for new_row, old_row in [(0, 0), (1, 3), (2, 2), (3, 1)]:  # blank; c; b stays; a
            torch.testing.assert_close(new.weight[new_row], old.weight[old_row])
            torch.testing.assert_close(new.bias[new_row], old.bias[old_row])


def test_refuses_pickles_that_could_run_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": argparse.Namespace(lr=1.0)}, path)  # an object, not plain data
    with pytest.raises(ValueError, match="refused"):
        load_checkpoint(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("hello")
    with pytest.raises(ValueError, match="not a PyTorch checkpoint"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


@pytest.mark.parametrize(
    "content, what",
    [
        (b"", "an empty file"),
        (b"\x00" * 4096, "neither a zip archive nor a pickle"),
        (b"\x1bMDB" + b"\x00" * 4092, "neither a zip archive nor a pickle"),
    ],
)
def test_another_kind_of_file_is_named_as_such_not_as_an_unsafe_pickle(tmp_path, content, what):
    """A data.mdb or an image given as a checkpoint: the unpickler would call it unsafe, or fail on some
    opcode; the file's first bytes already say it is no checkpoint."""
    path = tmp_path / "data.mdb"
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        load_checkpoint(path)
    assert str(error.value) == (
        f"{path}: not a PyTorch checkpoint ({what}); give a .pt file written by train.py or " f"torch.save"
    )


def test_failed_write_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"model": {"w": torch.ones(2)}, "step": 1})

    class Unsaveable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(path, {"model": {}, "step": 2, "bad": Unsaveable()})
    assert torch.load(path, weights_only=True)["step"] == 1
    assert list(tmp_path.iterdir()) == [path]
