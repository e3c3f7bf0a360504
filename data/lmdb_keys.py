"""The LMDB layout the text-recognition field shares (bgshih/crnn, crnn.pytorch,
deep-text-recognition-benchmark, mmocr): `image-%09d` (encoded image bytes), `label-%09d` (UTF-8
text), 1-based and contiguous, and `num-samples`. `meta-%09d` is this project's addition (what made
a synthetic sample); readers of the format ignore it. The one place the keys are spelled."""

NUM_SAMPLES = b"num-samples"
IMAGE_PREFIX, LABEL_PREFIX, META_PREFIX = b"image-", b"label-", b"meta-"


def image_key(index: int) -> bytes:
    return IMAGE_PREFIX + b"%09d" % index


def label_key(index: int) -> bytes:
    return LABEL_PREFIX + b"%09d" % index


def meta_key(index: int) -> bytes:
    return META_PREFIX + b"%09d" % index
