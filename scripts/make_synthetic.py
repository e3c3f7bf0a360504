"""Render a synthetic text-recognition dataset as LMDBs: OUT/train, OUT/val and OUT/test.

    python scripts/make_synthetic.py --out datasets/synth                 # 100,000 train, 2,000 val, 2,000 test
    python scripts/make_synthetic.py --out datasets/tiny --train 200 --val 50 --test 50 --overwrite
    python scripts/make_synthetic.py --out datasets/mine --fonts my_fonts/ --backgrounds photos/ --words words.txt
    python scripts/make_synthetic.py --out datasets/cjk --alphabet configs/alphabets/cjk_gb2312_level1.txt

What is written: real words (synthetic/words/english.txt, from SCOWL: synthetic/words/LICENSE-SCOWL.txt, or
`--words FILE`), numbers as they occur in print (years, amounts, prices, dates, codes), and random
strings, now and then with punctuation beside them (a mark the alphabet lacks is drawn, not
labelled, as the benchmarks score it); with a case-folding alphabet (lowercase, no capitals) in
lower, Capitalised and UPPER case, the label folded. Typefaces: every font installed on the machine
(fontconfig), every font package (`pip install -r requirements-synthetic.txt`) and `--fonts DIR`; a text
is drawn only with a font that has all of its characters. Appearance: dark-on-light and
light-on-dark, flat, gradient, noisy, blotchy and striped backgrounds, or photos: scikit-image's
public-domain samples (`pip install -r requirements-synthetic.txt`) and `--backgrounds DIR`'s;
outlines, shadows, letter spacing, curved baselines, neighbouring words and lines cut by tight or
loose crops; rotation, shear, perspective, short words steeply tilted in an upright crop; blur,
motion blur, low resolution, noise, JPEG artefacts.

`test` is rendered only with font families and background styles that train and val never use
(`--held-out-fonts`; paper, ruled/squared grid and halftone backgrounds; every fifth photo), so it
measures how a model reads what it has never seen. Each sample's font and background are stored
under `meta-%09d`. Every sample is drawn from its own generators, seeded from (seed, split, index):
a seed gives the same bytes whatever `--workers` is. Each split's meta.json (docs/data.md) records the
settings, the word list and the fonts, with their licences where known.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from collections import Counter
from contextlib import nullcontext
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

from tqdm import tqdm

from data.alphabet import load_alphabet
from data.lmdb_writer import check_replaceable, write_lmdb
from data.provenance import new_meta
from synthetic.backgrounds import package_photos
from synthetic.fonts import HELD_OUT_FAMILIES, FontPlan, needs_cjk_font
from synthetic.render import RenderPlan, build_plan, encode_meta, render_sample
from synthetic.text import SCOWL_NOTICE, WORDS_FILE, check_left_to_right
from utils import cli

DEFAULT_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
SPLITS = ("train", "val", "test")

# The plan of this run, set in each worker process by Pool's initializer (with fork, inherited
# without pickling): passing it with every task would pickle the word list thousands of times.
_plan: RenderPlan | None = None


def use_plan(plan: RenderPlan) -> None:
    global _plan
    _plan = plan


def start_worker(plan: RenderPlan) -> None:
    """Pool's initializer: the plan, and the signals a worker ends by (utils.cli)."""
    cli.default_stop_signals_in_worker()
    use_plan(plan)


def render(task: tuple[int, str, int]) -> tuple[bytes, str, bytes]:
    seed, split, index = task
    sample = render_sample(_plan, seed, split, index)
    return sample.image, sample.label, encode_meta(sample.meta)


def write_split(
    out: Path, seed: int, split: str, count: int, pool: Pool | None, overwrite: bool, meta: dict[str, Any]
) -> None:
    tasks = ((seed, split, index) for index in range(count))
    # imap keeps sample order, so the LMDB is the same with one worker or many.
    samples = pool.imap(render, tasks, chunksize=64) if pool else map(render, tasks)
    start = time.perf_counter()
    progress = tqdm(samples, total=count, desc=split, unit="img", mininterval=2.0)
    written = write_lmdb(out, progress, overwrite=overwrite, meta=meta)
    seconds = time.perf_counter() - start
    print(f"{split}: wrote {written} samples to {out} in {seconds:.1f} s ({written / max(seconds, 1e-9):.0f} images/s)")


def split_meta(args: argparse.Namespace, plan: RenderPlan, split: str, words_file: Path | None) -> dict[str, Any]:
    """The meta.json of one split: the project's own generated images, and what they were drawn with, each
    with its licence where the project knows it (a package font's metadata, the shipped word list's notice,
    scikit-image's public-domain photos); a system font's or a user's file's is for its owner to say."""
    origins = Counter(coverage.font.origin for coverage in plan.fonts_for(split).coverages)
    words = (
        "none (--no-words)"
        if words_file is None
        else f"{words_file} (SCOWL, {SCOWL_NOTICE})"
        if words_file == WORDS_FILE
        else f"{words_file} (licence not given)"
    )
    photos, shipped = plan.styles_for(split)[1], set(package_photos())
    return new_meta(
        f"synthetic {split}",
        "rendered by scripts/make_synthetic.py: no image or label was collected",
        "the project's generated data (the fonts' and word list's own licences: see generator)",
        generator={
            "seed": args.seed,
            "split": split,
            "alphabet": plan.fonts.alphabet,
            "max_length": args.max_length,
            "words": words,
            "fonts": [
                f"{origin}: {count} file(s)" + ("" if "(" in origin else ", licence not given")
                for origin, count in sorted(origins.items())
            ],
            "photos": f"{len(photos)} ({sum(photo in shipped for photo in photos)} scikit-image samples,"
            " public domain or CC0; the others from --backgrounds, licence not given)",
        },
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder that receives train/, val/ and test/")
    parser.add_argument("--train", type=int, default=100_000, help="training samples (default 100000)")
    parser.add_argument("--val", type=int, default=2_000, help="validation samples (default 2000)")
    parser.add_argument("--test", type=int, default=2_000, help="held-out test samples (default 2000; 0: none)")
    parser.add_argument("--seed", type=int, default=0, help="non-negative; same seed, same bytes")
    parser.add_argument("--alphabet", default=DEFAULT_ALPHABET, help="characters, or a .txt file with one per line")
    parser.add_argument("--max-length", type=int, default=12, help="longest text, in characters (default 12)")
    parser.add_argument(
        "--words",
        type=Path,
        help="UTF-8 word list, one per line (default: the shipped English list); words the alphabet"
        " cannot spell are skipped",
    )
    parser.add_argument("--no-words", action="store_true", help="draw numbers and random strings only")
    parser.add_argument("--fonts", type=Path, help="also draw with every .ttf/.otf/.ttc font in this folder")
    parser.add_argument(
        "--system-fonts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="draw with the fonts installed on the machine and as Python packages (default: yes;"
        " --no-system-fonts with --fonts DIR: that folder's fonts only)",
    )
    parser.add_argument(
        "--held-out-fonts",
        default=",".join(HELD_OUT_FAMILIES),
        metavar="FAMILY,FAMILY",
        help="font families rendered in test only, where installed (default: %(default)s)",
    )
    parser.add_argument("--backgrounds", type=Path, help="also draw on crops of the photos in this folder")
    parser.add_argument(
        "--package-photos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also draw on crops of the public-domain sample photos scikit-image ships, where installed"
        " (default: yes)",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="rendering processes")
    parser.add_argument("--overwrite", action="store_true", help="replace existing OUT/train, OUT/val and OUT/test")
    args = parser.parse_args(argv)
    check_counts(parser, args)
    return args


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop with a usage error naming the option when a count is out of range."""
    for option in ("train", "val", "test", "seed"):
        if getattr(args, option) < 0:
            parser.error(f"--{option} must be >= 0, got {getattr(args, option)}")
    if not args.train + args.val + args.test:
        parser.error("--train, --val and --test are all 0: there is nothing to write")
    for option in ("max_length", "workers"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")


def report_plan(
    plan: RenderPlan,
    alphabet: str,
    skipped_words: int,
    words_file: Path | None,
    system_fonts: bool,
    photo_package_missing: bool,
) -> None:
    """What the plan draws with, and a hint where an install step that pays on real text was missed."""
    report_fonts(plan.fonts, system_fonts)
    report_font_gaps(plan.fonts, alphabet)
    if words_file is not None:
        print(
            f"words: kept {len(plan.text.words)} of {len(plan.text.words) + skipped_words} in {words_file};"
            f" skipped {skipped_words} (characters outside the alphabet, or longer than --max-length)"
        )
    styles = {split: plan.styles_for(split)[0] for split in ("train", "test")}
    print(
        f"backgrounds: train and val {', '.join(styles['train'])}; test {', '.join(styles['test'])}"
        + (f"; photos {len(plan.photos)} + {len(plan.held_out_photos)} held out" if plan.photos else "")
    )
    if photo_package_missing:
        print(
            "  no photo backgrounds from packages: `pip install -r requirements-synthetic.txt` adds scikit-image's 12"
            " public-domain photos (a model trained with them reads real crops better, docs/real-text.md)"
        )


def check_families_named(named: tuple[str, ...], fonts: FontPlan) -> None:
    """Each family the user named in --held-out-fonts is one that can draw here: a typo would otherwise
    hold nothing out, and test would be drawn in the train fonts without a word of why."""
    families = sorted({coverage.font.family for coverage in fonts.train + fonts.held_out})
    by_lowercase = {family.lower(): family for family in families}
    for family in named:
        if family in families:
            continue
        close = difflib.get_close_matches(family.lower(), by_lowercase, n=1)
        guess = f" (did you mean {by_lowercase[close[0]]!r}?)" if close else ""
        sys.exit(
            f"error: --held-out-fonts: unknown font family {family!r}{guess}; choose among the families that"
            f" can draw the alphabet here: {', '.join(families)}"
        )


def report_fonts(fonts: FontPlan, system_fonts: bool) -> None:
    """The families each split draws with, where they come from, and a warning when they are few or no font
    package is installed (`system_fonts`: the machine's and the packages' fonts were asked for)."""
    train, held_out = fonts.families(held_out=False), fonts.families(held_out=True)
    origins = sorted({coverage.font.origin.split(" (")[0].split(" ")[0] for coverage in fonts.train + fonts.held_out})
    print(
        f"fonts: {len(train)} families for train and val, {len(held_out)} held out for test"
        f" ({len(fonts.train) + len(fonts.held_out)} files; from {', '.join(origins)})"
    )
    if held_out:
        print(f"  held out: {', '.join(held_out)}")
    elif len(train) == 1:
        print("  held out: none: a single family is installed, so test uses it too")
    else:  # was "a single family is installed" whatever the reason, e.g. of 71 families
        print(
            "  held out: none: no family --held-out-fonts names is installed, or it names every one (none would be"
            " left for train), so test uses the train fonts"
        )
    print(f"  train: {', '.join(train)}")
    packages = {
        coverage.font.origin for coverage in fonts.train + fonts.held_out if coverage.font.origin.startswith("package")
    }
    if packages:
        licences = Counter(origin.rpartition("(")[2].rstrip(")") for origin in packages)
        print(
            f"  {len(packages)} font packages, licences: "
            + ", ".join(f"{licence} {count}" for licence, count in licences.most_common())
        )
    if system_fonts and not packages:
        print(
            "  no font packages: `pip install -r requirements-synthetic.txt` adds the README's typefaces (a model"
            " trained on the system's fonts alone read real crops 11.8 points worse, docs/real-text.md)"
        )
    if len(train) < 5:
        print(
            "  few typefaces: a model trained on them reads other typefaces poorly; install more with"
            " `pip install -r requirements-synthetic.txt` (or fonts-* Debian packages, or --fonts DIR)"
        )


def report_font_gaps(fonts: FontPlan, alphabet: str) -> None:
    """The fonts not used and why, and the alphabet's characters that no font draws."""
    by_reason: dict[str, list[str]] = {}
    for font, reason in fonts.unusable:
        by_reason.setdefault(reason, []).append(Path(font).name if font else "the built-in font")
    for reason, names in by_reason.items():
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        print(f"not using {shown}: {reason}")
    if fonts.missing:
        shown = " ".join(repr(char) for char in fonts.missing[:20]) + (" ..." if len(fonts.missing) > 20 else "")
        print(
            f"{len(fonts.missing)} of the alphabet's {len(alphabet)} characters are in no font and are never"
            f" drawn: {shown}"
        )
        if needs_cjk_font(fonts.missing):
            print("  no CJK font has them: install fonts-noto-cjk or fonts-wqy-zenhei, or pass --fonts DIR")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        alphabet = load_alphabet(args.alphabet)
        check_left_to_right(alphabet)
    except (OSError, ValueError) as error:
        sys.exit(f"error: --alphabet: {error}")
    if alphabet.isspace():
        sys.exit("error: --alphabet has only whitespace; give it characters that can be drawn")
    counts = {split: getattr(args, split) for split in SPLITS if getattr(args, split)}  # the splits asked for
    # Checked before rendering anything, so an existing val does not fail the run after train is done.
    for split in counts:
        check_replaceable(args.out / split, args.overwrite)
    if args.no_words and args.words:
        sys.exit(f"error: --words {args.words} and --no-words contradict each other; keep one")
    words_file = None if args.no_words else args.words or WORDS_FILE
    if words_file is not None and words_file.is_dir():
        sys.exit(f"error: --words: {words_file} is a folder; give a word list file, one word per line")
    if words_file is not None and not words_file.is_file():
        sys.exit(f"error: --words: {words_file} does not exist")
    if not args.system_fonts and args.fonts is None:
        sys.exit("error: --no-system-fonts needs --fonts DIR: there would be no font to draw with")
    held_out = tuple(family.strip() for family in args.held_out_fonts.split(",") if family.strip())
    photos = tuple(package_photos()) if args.package_photos else ()  # the --backgrounds folder adds its own
    try:
        plan, skipped_words = build_plan(
            alphabet,
            args.max_length,
            words_file,
            args.fonts,
            held_out,
            args.backgrounds,
            args.system_fonts,
            photos,
        )
    except FileNotFoundError as error:
        option = "--backgrounds" if "background" in str(error) else "--fonts"
        sys.exit(f"error: {option}: {error}")
    except UnicodeDecodeError as error:
        sys.exit(f"error: --words: {words_file} is not UTF-8 text ({error})")
    if args.held_out_fonts != ",".join(HELD_OUT_FAMILIES):  # the default's families: those installed
        check_families_named(held_out, plan.fonts)
    report_plan(plan, alphabet, skipped_words, words_file, args.system_fonts, args.package_photos and not photos)
    if not plan.fonts.alphabet.strip():
        sys.exit(
            "error: no font can draw any character of the alphabet; install fonts that have them"
            " (fonts-noto-cjk for Chinese, Japanese and Korean) or pass --fonts DIR"
        )
    if words_file is not None and not plan.text.words:
        sys.exit(f"error: --words: no word of {words_file} can be drawn with this alphabet and these fonts")
    # The pool forks after the plan is computed: the workers inherit it.
    with Pool(args.workers, initializer=start_worker, initargs=(plan,)) if args.workers > 1 else nullcontext() as pool:
        use_plan(plan)
        for split, count in counts.items():
            meta = split_meta(args, plan, split, words_file)
            write_split(args.out / split, args.seed, split, count, pool, args.overwrite, meta)


if __name__ == "__main__":
    cli.run(main)
