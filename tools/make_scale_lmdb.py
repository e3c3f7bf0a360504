"""Write an LMDB of N samples quickly, in the field's format, to test the project at MJSynth +
SynthText's size (14.4 M) on a laptop disk.

    python tools/make_scale_lmdb.py --out datasets/scale15m --samples 15000000   # ~4 GB, a few minutes

Labels are real words (synthetic/words/english.txt, drawn with a seed, as written: mixed case); images are
a few small 1-bit PNGs of words (~200 bytes each) reused in turn, so an image does not show its label.
It measures start-up, memory, sampling and reading at scale (docs/data.md, "At MJSynth + SynthText
scale"); it is not for training a model to read.
"""

from __future__ import annotations

import argparse
import io
import random
import time
from pathlib import Path

import lmdb
from PIL import Image, ImageDraw, ImageFont

from data.lmdb_keys import NUM_SAMPLES, image_key, label_key
from data.lmdb_writer import FILE_MODE, check_replaceable, staged_lmdb

WORDS = Path(__file__).resolve().parents[1] / "synthetic" / "words" / "english.txt"
CHUNK = 1_000_000  # samples per transaction
MAP_SIZE = 1 << 40  # address space only: the file grows to what is written


def word_images(words: list[str], count: int) -> list[bytes]:
    """`count` 100x32 1-bit PNGs of words, drawn in Pillow's built-in font."""
    font = ImageFont.load_default(size=22)
    images = []
    for word in words[:count]:
        image = Image.new("L", (100, 32), 255)
        ImageDraw.Draw(image).text((4, 4), word, fill=0, font=font)
        buffer = io.BytesIO()
        image.convert("1").save(buffer, "PNG", optimize=True)
        images.append(buffer.getvalue())
    return images


def write_scale_lmdb(path: Path, samples: int, variants: int, seed: int) -> None:
    """Images first, then labels, each in key order: appended to the B-tree's end, every page is
    filled, which is what makes this fast and the file small. Built beside `path`, renamed at the end."""
    words = [line.strip() for line in WORDS.read_text(encoding="utf-8").splitlines() if line.strip()]
    random.Random(seed).shuffle(words)
    images = word_images(words, variants)
    encoded_words = [word.encode("utf-8") for word in words]
    with staged_lmdb(path) as staging, lmdb.open(str(staging), map_size=MAP_SIZE, sync=False, mode=FILE_MODE) as env:
        for key, value in (
            (image_key, lambda i: images[i % len(images)]),
            (label_key, lambda i: encoded_words[i % len(encoded_words)]),
        ):
            for start in range(1, samples + 1, CHUNK):
                with env.begin(write=True) as txn:
                    txn.cursor().putmulti(
                        ((key(i), value(i)) for i in range(start, min(start + CHUNK, samples + 1))), append=True
                    )
        with env.begin(write=True) as txn:
            txn.put(NUM_SAMPLES, str(samples).encode())
        env.sync(True)  # the environment closes before the folder is renamed into place


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the LMDB folder to write")
    parser.add_argument("--samples", type=int, default=15_000_000, help="how many samples (default 15,000,000)")
    parser.add_argument("--variants", type=int, default=16, help="distinct images, reused in turn (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="draws the order of the words")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing LMDB at --out")
    args = parser.parse_args()
    if args.samples < 1 or args.variants < 1:
        parser.error("--samples and --variants must be 1 or more")
    check_replaceable(args.out, args.overwrite)
    started = time.perf_counter()
    write_scale_lmdb(args.out, args.samples, args.variants, args.seed)
    seconds = time.perf_counter() - started
    size = (args.out / "data.mdb").stat().st_blocks * 512
    print(
        f"{args.out}: {args.samples:,} samples, {size / 1e9:.2f} GB on disk, in {seconds:.0f} s "
        f"({args.samples / seconds:,.0f} samples/s)"
    )


if __name__ == "__main__":
    main()
