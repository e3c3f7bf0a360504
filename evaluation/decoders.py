"""CTC decoders: `[B, T, C]` logits -> one `Reading` per image, chosen by name (`--decoder`).

- `greedy` (the default, in tree): data.codec.CTCCodec.decode, the most likely class in each frame.
- `beam`: prefix beam search by fast-ctc-decoder (nanoporetech, Rust; wheels for CPython 3.10-3.13).
  Chosen over torchaudio's flashlight-based `ctc_decoder`, which ends with torchaudio 2.11 (no build
  for torch 2.14), and over flashlight-text itself (no wheel for Python 3.13); pyctcdecode and
  parlance's ctcdecode are unmaintained.
- `lexicon`: the CRNN paper's lexicon-based transcription (Shi, Bai & Yao 2015, section 2.3.2): the
  lexicon's words within edit distance `max_distance` of the greedy reading (found by rapidfuzz, in
  place of the paper's BK-tree) are ranked by their CTC probability given the frames, which PyTorch's
  own `ctc_loss` computes, and the most probable one is read. A reading with no word that near is kept
  as greedy read it (a number, a name the lexicon lacks). Words are matched case-insensitively, then
  scored in each case the alphabet can spell (lower, Title, UPPER, the lexicon's own), so a mixed-case
  model keeps the case it sees.

Beam and lexicon decoding need the `decode` extra: pip install -r requirements-decode.txt.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from data.codec import CTCCodec, Reading, ctc_min_frames

DECODERS = ("greedy", "beam", "lexicon")
BEAM_SIZE = 10  # --decoder beam's beam when --beam-size is not given


def add_decoder_options(parser: argparse.ArgumentParser) -> None:
    """--decoder, --lexicon and --beam-size, as every command that reads with a checkpoint takes them
    (build_decoder checks their values)."""
    parser.add_argument("--decoder", default="greedy", choices=DECODERS, help="CTC decoding (default greedy)")
    parser.add_argument("--lexicon", type=Path, metavar="FILE", help="--decoder lexicon's words, one per line")
    parser.add_argument("--beam-size", type=int, metavar="N", help=f"--decoder beam's beam (default {BEAM_SIZE})")


Decoder = Callable[[Tensor], list[Reading]]  # [B, T, C] logits -> one reading per image
BLANK_LABEL = "\0"  # fast-ctc-decoder's name for class 0; never part of a decoded text


def optional_module(name: str, decoder: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(
            f"--decoder {decoder} needs {name}; install it with: pip install -r requirements-decode.txt"
        ) from None


def build_decoder(
    name: str, codec: CTCCodec, lexicon: Path | None = None, beam_size: int | None = None, max_distance: int = 3
) -> Decoder:
    """The decoder called `name`; `lexicon` (one word per line) is what `lexicon` reads from. An option
    given to a decoder that does not use it is refused: it would do nothing, and say nothing."""
    if name not in DECODERS:
        raise ValueError(f"--decoder {name}: choose one of {', '.join(DECODERS)}")
    if (name == "lexicon") != (lexicon is not None):
        raise ValueError("--lexicon FILE goes with --decoder lexicon, and --decoder lexicon needs --lexicon FILE")
    if beam_size is not None and name != "beam":
        raise ValueError(
            f"--beam-size {beam_size} is for --decoder beam; --decoder {name} has no beam: add"
            f" --decoder beam or leave out --beam-size"
        )
    if name == "greedy":
        return codec.decode
    if name == "beam":
        return BeamDecoder(codec, BEAM_SIZE if beam_size is None else beam_size)
    return LexiconDecoder(codec, read_lexicon(lexicon, codec), max_distance)


class BeamDecoder:
    """CTC prefix beam search; characters' probabilities as `aligned_char_probs` finds them."""

    def __init__(self, codec: CTCCodec, beam_size: int) -> None:
        if beam_size < 1:
            raise ValueError(f"--beam-size {beam_size}: must be at least 1")
        self.search = optional_module("fast_ctc_decoder", "beam").beam_search
        self.labels = [BLANK_LABEL, *codec.alphabet]
        self.codec = codec
        self.beam_size = beam_size

    def __call__(self, logits: Tensor) -> list[Reading]:
        log_probs = logits.detach().float().log_softmax(-1).cpu()  # [B, T, C]
        readings = []
        for frames in log_probs:
            text, _ = self.search(np.ascontiguousarray(frames.exp().numpy()), self.labels, beam_size=self.beam_size)
            readings.append(Reading(text, aligned_char_probs(frames, self.codec.encode([text])[0].tolist())))
        return readings


def read_lexicon(path: Path, codec: CTCCodec) -> list[str]:
    """The words of `path` (one per line, UTF-8) that the model can spell, in file order, without repeats."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"--lexicon {path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"--lexicon {path} is a folder; give a file of words, one per line") from None
    except UnicodeDecodeError:
        raise ValueError(f"--lexicon {path}: not UTF-8 text; give one word per line") from None
    words = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    spellable = [word for word in words if not codec.unknown_characters(codec.normalize(word))]
    if not spellable:
        raise ValueError(f"--lexicon {path}: none of its {len(words)} words can be spelled with the model's alphabet")
    return spellable


class LexiconDecoder:
    """The CRNN paper's lexicon-based transcription (see the module's docstring)."""

    def __init__(self, codec: CTCCodec, words: list[str], max_distance: int) -> None:
        self.process = optional_module("rapidfuzz.process", "lexicon")
        self.distance = optional_module("rapidfuzz.distance.Levenshtein", "lexicon").distance
        self.codec = codec
        self.max_distance = max_distance
        self.spellings: dict[str, list[str]] = {}  # lowercased word -> the spellings to score
        for word in words:
            self.spellings.setdefault(word.lower(), []).append(word)
        self.keys = list(self.spellings)

    def candidates(self, reading: str) -> list[str]:
        """The spellings of the lexicon's words within `max_distance` of `reading`, in every case the model emits."""
        matches = self.process.extract(
            reading.lower(), self.keys, scorer=self.distance, score_cutoff=self.max_distance, limit=None
        )
        spellings = dict.fromkeys(
            self.codec.normalize(spelling)
            for key, _, _ in matches
            for spelling in (*self.spellings[key], key, key.title(), key.upper())
        )
        return [spelling for spelling in spellings if not self.codec.unknown_characters(spelling)]

    def __call__(self, logits: Tensor) -> list[Reading]:
        log_probs = logits.detach().float().log_softmax(-1).cpu()  # [B, T, C]
        readings = []
        for frames, greedy in zip(log_probs, self.codec.decode(logits)):
            words = [word for word in self.candidates(greedy.text) if ctc_min_frames(word) <= len(frames)]
            if not words:
                readings.append(greedy)
                continue
            targets, target_lengths = self.codec.encode(words)
            losses = F.ctc_loss(
                frames.unsqueeze(1).expand(-1, len(words), -1),
                targets,
                torch.full((len(words),), len(frames), dtype=torch.long),
                target_lengths,
                reduction="none",
                zero_infinity=False,
            )  # [N]: -log p(word | frames)
            word = words[int(losses.argmin())]
            readings.append(Reading(word, aligned_char_probs(frames, self.codec.encode([word])[0].tolist())))
        return readings


def aligned_char_probs(log_probs: Tensor, classes: list[int]) -> tuple[float, ...]:
    """Each character's probability under the most probable CTC alignment of `classes` to the `[T, C]`
    frames (Viterbi): the highest probability among the frames aligned to it, as greedy decoding gives."""
    if not classes:
        return ()
    states = [0]  # blank, c1, blank, c2, ..., blank
    for cls in classes:
        states += [cls, 0]
    frames = log_probs.numpy()[:, states]  # [T, S]
    steps, count = frames.shape
    score = np.full(count, -np.inf)
    score[:2] = frames[0, :2]
    back = np.zeros((steps, count), dtype=np.int64)
    for t in range(1, steps):
        stay, advance = score, np.concatenate([[-np.inf], score[:-1]])
        # Skipping a blank is allowed between two different characters.
        skip = np.concatenate([[-np.inf, -np.inf], score[:-2]])
        skip[[s for s in range(count) if states[s] == 0 or (s >= 2 and states[s] == states[s - 2])]] = -np.inf
        choices = np.stack([stay, advance, skip])  # [3, S]
        back[t] = choices.argmax(0)
        score = choices.max(0) + frames[t]
    state = count - 1 if score[-1] >= score[-2] else count - 2
    best = np.full(len(classes), -np.inf)
    for t in range(steps - 1, -1, -1):
        if states[state] != 0:
            best[(state - 1) // 2] = max(best[(state - 1) // 2], frames[t, state])
        state -= back[t, state]
    return tuple(float(np.exp(value)) for value in best)
