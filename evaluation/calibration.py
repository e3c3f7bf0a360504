"""Calibrated confidence: one temperature T that divides the model's logits before the softmax, fitted on a
labelled set so that a word confidence of 0.8 is right about 80 % of the time.

The greedy reading is the argmax of each frame, which no T > 0 changes; only the character probabilities,
and so the word confidence (data.codec.word_confidence), do. T is fitted by minimising the binary
cross-entropy of "the reading is correct" under the word confidence: a search over log T in
TEMPERATURE_RANGE, then a golden-section refinement around the best grid point. What a confidence depends
on is kept per reading (ReadingFrames: the logits of the frames that emitted its characters), so that a
refit or the confidence under another T costs no forward pass.

The expected calibration error (ECE) is the readings' share-weighted |accuracy - mean confidence| over
ECE_BINS equal-width confidence bins of [0, 1] (a confidence of exactly 1 falls in the last bin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from data.codec import CTCCodec, Reading
from data.lmdb_dataset import Batch
from evaluation.metrics import is_correct

ECE_BINS = 15
TEMPERATURE_RANGE = (0.05, 20.0)
GRID_POINTS = 61  # over log T: neighbours ~10 % apart, then refined
REFINE_STEPS = 40  # golden-section steps: the bracket shrinks to 0.618^40 of two grid steps
EPSILON = 1e-12  # confidences are clipped to [EPSILON, 1 - EPSILON] in the log-likelihood


@dataclass(frozen=True)
class ReadingFrames:
    """Greedy readings, each with what its word confidence depends on: the logits of the frames that
    emitted a character (`frame_logits` [F, C]), which character of all readings each frame belongs to
    (`char_of_frame` [F]), which reading each character belongs to (`reading_of_char` [N]), the
    readings' lengths (`lengths` [S]) and whether each is correct (`correct` [S])."""

    frame_logits: Tensor
    char_of_frame: Tensor
    reading_of_char: Tensor
    lengths: Tensor
    correct: Tensor

    def __len__(self) -> int:
        return len(self.lengths)


def greedy_frames(logits: Tensor) -> list[tuple[Tensor, Tensor]]:
    """For each of a batch's `[B, T, C]` logits, the frames that emitted a character in greedy CTC decoding
    (`[k, C]`, float32 on the CPU) and the character each belongs to (`[k]`, 0..n-1): a frame that repeats
    the previous frame's class extends its character, as data.codec.CTCCodec.decode reads it."""
    logits = logits.detach().float().cpu()
    classes = logits.argmax(-1)  # [B, T]
    previous = torch.cat([torch.zeros_like(classes[:, :1]), classes[:, :-1]], dim=1)
    emitting = classes != 0
    starts = emitting & (classes != previous)
    char_index = starts.cumsum(1) - 1  # [B, T]
    return [(logits[row][emitting[row]], char_index[row][emitting[row]]) for row in range(len(logits))]


class FrameCollector:
    """An `on_batch` for evaluation.evaluate: keeps each greedy reading's frames (greedy_frames) and whether it
    reads its label under `mode`; a sample `mode` leaves out (an empty label) is not kept. `samples` holds
    (key, frames, characters, correct), the key being the LMDB index where the batch has them (scripts/eval.py's),
    so that shards merge in one order whatever the number of processes.

    With `temperature` (the one a calibrated model has folded in), `samples` holds (key, confidence before it,
    confidence after it, correct) instead: two numbers a reading whatever the alphabet's size, where its frames
    would take frames x classes (an evaluation of a large set with thousands of classes)."""

    def __init__(self, codec: CTCCodec, mode: str, temperature: float | None = None) -> None:
        self.codec, self.mode, self.temperature = codec, mode, temperature
        self.samples: list[tuple] = []
        self.seen = 0  # the key of a sample whose batch has no LMDB indices: its position in the loader

    def __call__(self, batch: Batch, readings: list[Reading], logits: Tensor) -> None:
        # The greedy reading, whatever the decoder: the confidence calibrated is that of the greedy path.
        greedy = self.codec.decode(logits)
        keys = getattr(batch, "indices", None) or range(self.seen, self.seen + len(greedy))
        self.seen += len(greedy)
        kept = []
        for key, label, reading, (frames, chars) in zip(keys, batch.labels, greedy, greedy_frames(logits)):
            correct = is_correct(reading.text, label, self.mode, self.codec.alphabet)
            if correct is not None:
                kept.append((key, frames, chars, correct))
        if self.temperature is None:
            self.samples.extend(kept)
            return
        readings = join_frames([(frames, chars) for _, frames, chars, _ in kept], [correct for *_, correct in kept])
        before, after = confidences(readings, 1 / self.temperature).tolist(), confidences(readings).tolist()
        self.samples.extend((key, *pair, correct) for (key, *_, correct), *pair in zip(kept, before, after))


def join_samples(samples: list[tuple[int, Tensor, Tensor, bool]]) -> ReadingFrames:
    """FrameCollector samples (of any number of collectors and processes) as one ReadingFrames, in key order."""
    ordered = sorted(samples, key=lambda sample: sample[0])
    return join_frames([(frames, chars) for _, frames, chars, _ in ordered], [correct for *_, correct in ordered])


def join_frames(readings: list[tuple[Tensor, Tensor]], correct: list[bool]) -> ReadingFrames:
    """One ReadingFrames of greedy_frames' readings and whether each is correct."""
    if not readings:
        return ReadingFrames(torch.zeros(0, 1), *(torch.zeros(0, dtype=torch.long) for _ in range(3)), torch.zeros(0))
    lengths = torch.tensor([int(chars.max()) + 1 if len(chars) else 0 for _, chars in readings])
    offsets = lengths.cumsum(0) - lengths
    return ReadingFrames(
        frame_logits=torch.cat([frames for frames, _ in readings]),
        char_of_frame=torch.cat([chars + offset for (_, chars), offset in zip(readings, offsets.tolist())]),
        reading_of_char=torch.repeat_interleave(torch.arange(len(readings)), lengths),
        lengths=lengths,
        correct=torch.tensor(correct, dtype=torch.float64),
    )


def confidences(frames: ReadingFrames, temperature: float = 1.0) -> Tensor:
    """The word confidence `[S]` of each reading with its logits divided by `temperature` (float64): its
    characters' probabilities (each the highest of its frames) multiplied, to the power 2 / sqrt(n), 0 for
    an empty reading (data.codec.word_confidence)."""
    frame_log_probs = (frames.frame_logits.double() / temperature).log_softmax(-1).amax(-1)  # [F]
    char_log_probs = torch.full((len(frames.reading_of_char),), -math.inf, dtype=torch.float64)
    char_log_probs = char_log_probs.scatter_reduce(0, frames.char_of_frame, frame_log_probs, "amax")
    word_log_probs = torch.zeros(len(frames), dtype=torch.float64).index_add(0, frames.reading_of_char, char_log_probs)
    lengths = frames.lengths.double()
    exponents = torch.where(lengths > 0, 2 / lengths.clamp(min=1).sqrt(), 0.0)
    return torch.where(lengths > 0, (word_log_probs * exponents).exp(), 0.0)


def negative_log_likelihood(frames: ReadingFrames, temperature: float) -> float:
    """The mean binary cross-entropy of the readings' correctness under their confidence at `temperature`."""
    confidence = confidences(frames, temperature).clamp(EPSILON, 1 - EPSILON)
    correct = frames.correct
    return float(-(correct * confidence.log() + (1 - correct) * (-confidence).log1p()).mean())


def fit_temperature(frames: ReadingFrames) -> float:
    """The temperature in TEMPERATURE_RANGE whose confidences best predict which readings are correct."""
    if not len(frames):
        raise ValueError("no readings to fit a temperature on")
    low, high = (math.log(bound) for bound in TEMPERATURE_RANGE)
    grid = [low + (high - low) * step / (GRID_POINTS - 1) for step in range(GRID_POINTS)]
    losses = [negative_log_likelihood(frames, math.exp(point)) for point in grid]
    # Ties go to the point nearest T = 1: readings whose confidence no T moves (all empty) leave it as it is.
    best = min(range(GRID_POINTS), key=lambda index: (losses[index], abs(grid[index])))
    left, right = grid[max(best - 1, 0)], grid[min(best + 1, GRID_POINTS - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(REFINE_STEPS):
        first, second = right - ratio * (right - left), left + ratio * (right - left)
        if negative_log_likelihood(frames, math.exp(first)) <= negative_log_likelihood(frames, math.exp(second)):
            right = second
        else:
            left = first
    refined = (left + right) / 2
    if negative_log_likelihood(frames, math.exp(refined)) > losses[best]:  # the grid point was already the best
        refined = grid[best]
    return math.exp(refined)


def expected_calibration_error(confidence: Tensor, correct: Tensor, bins: int = ECE_BINS) -> float:
    """Σ over equal-width confidence bins of (share of the readings) x |accuracy - mean confidence|."""
    if not len(confidence):
        return 0.0
    confidence, correct = confidence.double(), correct.double()
    which = (confidence * bins).long().clamp(0, bins - 1)
    # Σ_b (n_b / N) |mean confidence_b - accuracy_b| = Σ_b |Σ confidence - Σ correct| / N
    confidence_sums = torch.zeros(bins, dtype=torch.float64).index_add(0, which, confidence)
    correct_sums = torch.zeros(bins, dtype=torch.float64).index_add(0, which, correct)
    return float((confidence_sums - correct_sums).abs().sum() / len(confidence))


def reliability_bins(confidence: Tensor, correct: Tensor, bins: int = ECE_BINS) -> list[tuple[int, float, float]]:
    """Per equal-width bin: (readings, mean confidence, accuracy); (0, 0, 0) for an empty bin."""
    which = (confidence.double() * bins).long().clamp(0, bins - 1)
    table = []
    for index in range(bins):
        inside = which == index
        count = int(inside.sum())
        if not count:
            table.append((0, 0.0, 0.0))
            continue
        table.append((count, float(confidence[inside].mean()), float(correct[inside].double().mean())))
    return table


def calibration_report(samples: list[tuple], temperature: float) -> dict:
    """The ECE before and after `temperature`, and the reliability tables of both, of the (key, confidence
    before, confidence after, correct) samples of a FrameCollector given that temperature (of any number of
    collectors and processes: taken in key order)."""
    ordered = sorted(samples, key=lambda sample: sample[0])
    before, after, correct = (
        torch.tensor([sample[part] for sample in ordered], dtype=torch.float64) for part in (1, 2, 3)
    )
    return {
        "temperature": temperature,
        "readings": len(ordered),
        "ece_before": expected_calibration_error(before, correct),
        "ece_after": expected_calibration_error(after, correct),
        "reliability_before": reliability_bins(before, correct),
        "reliability_after": reliability_bins(after, correct),
    }


@dataclass(frozen=True)
class Calibration:
    """A fitted temperature and the ECE of the readings it was fitted on, before (T = 1) and after."""

    temperature: float
    ece_before: float
    ece_after: float
    readings: int


def calibrate(frames: ReadingFrames) -> Calibration:
    """Fit the temperature on `frames` (greedy readings of the raw, uncalibrated logits)."""
    temperature = fit_temperature(frames)
    return Calibration(
        temperature=temperature,
        ece_before=expected_calibration_error(confidences(frames), frames.correct),
        ece_after=expected_calibration_error(confidences(frames, temperature), frames.correct),
        readings=len(frames),
    )
