"""Beam and lexicon decoding (evaluation/decoders.py) on hand-made frames, and through eval.sh and predict.py."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch

from data.codec import CTCCodec
from data.lmdb_writer import write_lmdb
from data.transforms import ImageTransform
from evaluation.decoders import aligned_char_probs, build_decoder
from tests.conftest import REPO, read_lmdb, run_env, write_images
from training.checkpoint import load_model


def frames_from_probs(rows: list[list[float]]) -> torch.Tensor:
    """`[1, T, C]` logits whose softmax is `rows`."""
    return torch.tensor(rows).log()[None]


def test_beam_finds_the_labelling_greedy_misses():
    # Each frame: blank 0.6, "a" 0.4. The best path is blank-blank (""), but "a" has three paths
    # (a-, -a, aa): 0.24 + 0.24 + 0.16 = 0.64 against 0.36.
    codec = CTCCodec("ab")
    logits = frames_from_probs([[0.6, 0.4, 1e-6], [0.6, 0.4, 1e-6]])
    assert codec.decode(logits)[0].text == ""
    [reading] = build_decoder("beam", codec)(logits)
    assert reading.text == "a"
    assert reading.char_probs == pytest.approx([0.4], rel=1e-4)  # its frame on the most probable alignment
    # All blank, beyond doubt: an empty reading, with no character and confidence 0.
    [empty] = build_decoder("beam", codec)(frames_from_probs([[0.98, 0.01, 0.01], [0.98, 0.01, 0.01]]))
    assert empty.text == "" and empty.char_probs == () and empty.confidence == 0.0


def spelled(codec: CTCCodec, text: str, runner_up: dict[int, str]) -> torch.Tensor:
    """Logits that read `text` one frame per character with blanks between, and at frame t put
    `runner_up[t]` a little below the character read there."""
    rows = []
    for position, char in enumerate(text):
        row = torch.full((codec.num_classes,), -5.0)
        row[codec.index[char]] = 3.0
        if position in runner_up:
            row[codec.index[runner_up[position]]] = 2.5
        blank = torch.full((codec.num_classes,), -5.0)
        blank[0] = 3.0
        rows += [row, blank]
    return torch.stack(rows)[None]  # [1, T, C]


def test_lexicon_reads_the_nearest_word_the_frames_make_most_probable(tmp_path):
    codec = CTCCodec("abcdefghijklmnopqrstuvwxyz")
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("hello\nhullo\nhelp\nworld\n", encoding="utf-8")
    logits = spelled(codec, "hallo", {1: "e"})  # "a" first, "e" a close second
    assert codec.decode(logits)[0].text == "hallo"
    [reading] = build_decoder("lexicon", codec, lexicon)(logits)
    assert reading.text == "hello"  # hullo is as near, but "u" has no probability in frame 1
    probs = logits[0].softmax(-1)
    assert reading.char_probs[1] == pytest.approx(probs[2, codec.index["e"]].item(), rel=1e-4)
    # Nothing within 3 edits: the reading stays as greedy read it.
    far = tmp_path / "far.txt"
    far.write_text("xylophone\n", encoding="utf-8")
    assert build_decoder("lexicon", codec, far)(logits)[0].text == "hallo"


def test_lexicon_keeps_the_case_a_mixed_case_model_sees(tmp_path):
    codec = CTCCodec("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("hello\n", encoding="utf-8")
    assert build_decoder("lexicon", codec, lexicon)(spelled(codec, "HALLO", {1: "E"}))[0].text == "HELLO"
    assert build_decoder("lexicon", codec, lexicon)(spelled(codec, "Hallo", {1: "e"}))[0].text == "Hello"


def test_the_aligned_probabilities_of_the_greedy_text_are_greedys_own():
    codec = CTCCodec("abc")
    torch.manual_seed(0)
    logits = torch.randn(4, 15, codec.num_classes) * 3
    for frames, reading in zip(logits, codec.decode(logits)):
        aligned = aligned_char_probs(frames.log_softmax(-1), codec.encode([reading.text])[0].tolist())
        assert aligned == pytest.approx(reading.char_probs, rel=1e-5)


def test_decoder_options_are_checked_with_one_clear_line(tmp_path):
    codec = CTCCodec("abc")
    with pytest.raises(ValueError, match="--decoder lexicon needs --lexicon FILE"):
        build_decoder("lexicon", codec)
    with pytest.raises(ValueError, match="--lexicon FILE goes with --decoder lexicon"):
        build_decoder("beam", codec, tmp_path / "words.txt")
    with pytest.raises(FileNotFoundError, match="no such file"):
        build_decoder("lexicon", codec, tmp_path / "missing.txt")
    (tmp_path / "digits.txt").write_text("123\n456\n", encoding="utf-8")
    with pytest.raises(ValueError, match="none of its 2 words can be spelled"):
        build_decoder("lexicon", codec, tmp_path / "digits.txt")


@pytest.mark.slow
def test_eval_and_predict_read_with_the_decoder_asked_for(tiny_run, synth, tmp_path):
    checkpoint, val = tiny_run / "last.pt", synth / "val"
    samples = read_lmdb(val)[:12]
    write_lmdb(tmp_path / "words", samples)
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text("\n".join(label for _, label in samples), encoding="utf-8")
    accuracy = {}
    for decoder in (["greedy"], ["beam"], ["lexicon", "--lexicon", str(lexicon)]):
        out = tmp_path / f"{decoder[0]}.json"
        result = subprocess.run(
            [
                sys.executable,
                "scripts/eval.py",
                str(checkpoint),
                str(tmp_path / "words"),
                "--workers",
                "0",
                "--precision",
                "fp32",
                "--decoder",
                *decoder,
                "--json",
                str(out),
            ],
            cwd=REPO,
            env=run_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0].endswith(f"decoder {decoder[0]}")
        data = json.loads(out.read_text())
        assert data["decoder"] == decoder[0]
        accuracy[decoder[0]] = data["combined"]["accuracy"]
    # Every label is in the lexicon: reading the nearest word can only gain on a model this weak.
    assert accuracy["lexicon"] >= accuracy["greedy"]

    paths = write_images(synth, tmp_path / "images", 3)
    result = subprocess.run(
        [
            sys.executable,
            "scripts/predict.py",
            str(checkpoint),
            *map(str, paths),
            "--precision",
            "fp32",
            "--decoder",
            "lexicon",
            "--lexicon",
            str(lexicon),
        ],
        cwd=REPO,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    model, codec, _, preprocessing = load_model(checkpoint)
    decode, transform = build_decoder("lexicon", codec, lexicon), ImageTransform(preprocessing)
    with torch.inference_mode():
        expected = [decode(model(transform(path.read_bytes())[None]))[0].text for path in paths]
    assert [line.split("\t")[1] for line in result.stdout.splitlines()] == expected


def test_a_missing_decode_extra_is_named_with_the_install_command(monkeypatch):
    real_import = importlib.import_module

    def without_the_extra(name: str):
        if name.startswith(("fast_ctc_decoder", "rapidfuzz")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name)

    monkeypatch.setattr(importlib, "import_module", without_the_extra)
    with pytest.raises(
        ImportError,
        match=r"--decoder beam needs fast_ctc_decoder; install it with: pip install -r " r"requirements-decode.txt",
    ):
        build_decoder("beam", CTCCodec("abc"))


@pytest.mark.slow
def test_eval_and_predict_name_a_missing_extra_in_one_line(tiny_run, synth, tmp_path):
    """A decoder package that fails to import (here: one that raises, put first on the path) is one
    `error:` line naming the install command, not a traceback."""
    (tmp_path / "fast_ctc_decoder").mkdir()
    (tmp_path / "fast_ctc_decoder" / "__init__.py").write_text("raise ImportError('not installed')\n")
    environment = {**run_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    image = write_images(synth, tmp_path / "images", 1)[0]
    for command in (
        ["scripts/eval.py", str(tiny_run / "last.pt"), str(synth / "val")],
        ["scripts/predict.py", str(tiny_run / "last.pt"), str(image)],
    ):
        result = subprocess.run(
            [sys.executable, *command, "--decoder", "beam", "--precision", "fp32"],
            cwd=REPO,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip() == (
            "error: --decoder beam needs fast_ctc_decoder; install it with: " "pip install -r requirements-decode.txt"
        )
