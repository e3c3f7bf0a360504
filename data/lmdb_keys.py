"""The LMDB layout the text-recognition field shares (bgshih/crnn, crnn.pytorch,
deep-text-recognition-benchmark, mmocr): `image-%09d` (encoded image bytes), `label-%09d` (UTF-8
text), 1-based and contiguous, and `num-samples`. `meta-%09d` is this project's addition (what made
a synthetic sample); readers of the format ignore it. The one place the keys are spelled, and the one
place a label is read (`read_label`)."""

from __future__ import annotations

import lmdb

NUM_SAMPLES = b"num-samples"
IMAGE_PREFIX, LABEL_PREFIX, META_PREFIX = b"image-", b"label-", b"meta-"


def image_key(index: int) -> bytes:
    return IMAGE_PREFIX + b"%09d" % index


def label_key(index: int) -> bytes:
    return LABEL_PREFIX + b"%09d" % index


def meta_key(index: int) -> bytes:
    return META_PREFIX + b"%09d" % index


class LabelNotUtf8(ValueError):
    """A label whose bytes are not UTF-8. `text` is what every reader reads instead: the label with U+FFFD
    in place of the bad bytes."""

    def __init__(self, index: int, text: str) -> None:
        super().__init__(f"label {index} is not valid UTF-8; training reads it with U+FFFD in place of the bad bytes")
        self.index, self.text = index, text


def read_label(txn: lmdb.Transaction, index: int, strict: bool = False) -> str | None:
    """Sample `index`'s label as text, or None where the LMDB has no label key for it.

    Bytes that are not UTF-8 read as U+FFFD, for training and evaluation alike: one mangled label must
    not stop a scan of millions, and an alphabet without U+FFFD then drops the sample as holding a
    character outside it. `strict` raises LabelNotUtf8 instead, for a tool that reports such labels.
    """
    raw = txn.get(label_key(index))
    if raw is None:
        return None
    raw = bytes(raw)  # a memoryview in a buffers=True transaction
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        if strict:
            raise LabelNotUtf8(index, text) from None
        return text
