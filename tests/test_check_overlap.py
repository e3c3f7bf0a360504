"""scripts/check_overlap.py and data/overlap.py on generated LMDBs: copies of evaluation crops planted in a
training set (re-encoded, resized, cut, byte-identical) are found, different words in one font are not,
and the outputs (--json, --pairs, --write-filtered) and the refusals of bad input are what they say."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from data import overlap
from data.lmdb_env import open_lmdb, read_num_samples
from data.lmdb_keys import read_label
from data.lmdb_writer import write_lmdb
from scripts import check_overlap
from tests.conftest import one_line_error, read_lmdb, run_command

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_overlap.py"
PLANTED_SOURCES = 20  # evaluation samples copied into the training set, each in every PLANTS way
CLEAN_TRAIN = 30  # training samples of other words, which nothing may match


def jpeg(image: Image.Image, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def encoded(image: Image.Image, image_format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


def decoded(image_bytes: bytes) -> Image.Image:
    return Image.open(io.BytesIO(image_bytes)).convert("RGB")


def resized(image: Image.Image, factor: float) -> Image.Image:
    return image.resize((round(image.width * factor), round(image.height * factor)), Image.Resampling.BILINEAR)


# The ways a crop comes back into a training set: the same file, saved again, scaled, or cut a little.
PLANTS = {
    "byte-identical": lambda image_bytes: image_bytes,
    "JPEG quality 70": lambda image_bytes: jpeg(decoded(image_bytes), 70),
    "resized 0.8x": lambda image_bytes: jpeg(resized(decoded(image_bytes), 0.8)),
    "resized 1.25x": lambda image_bytes: jpeg(resized(decoded(image_bytes), 1.25)),
    "3 px off the left": lambda image_bytes: jpeg(decoded(image_bytes).crop((3, 0, *decoded(image_bytes).size))),
    "2 px off the top": lambda image_bytes: jpeg(decoded(image_bytes).crop((0, 2, *decoded(image_bytes).size))),
}


def plant(eval_samples: list[tuple[bytes, str]], clean: list[tuple[bytes, str]]) -> tuple[list, dict[int, int]]:
    """A training set of `clean` then every PLANTS copy of the first PLANTED_SOURCES evaluation samples, and
    which evaluation index (1-based) each planted training index copies."""
    samples = list(clean)
    sources = {}
    for eval_position, (image_bytes, label) in enumerate(eval_samples[:PLANTED_SOURCES]):
        for make_copy in PLANTS.values():
            samples.append((make_copy(bytes(image_bytes)), label))
            sources[len(samples)] = eval_position + 1
    return samples, sources


def recall_and_false_flags(train: Path, evaluation: Path, sources: dict[int, int]) -> tuple[float, set[int], list]:
    """The share of planted copies matched to their own source, the clean training indices flagged, the matches."""
    matches = overlap.find_matches(overlap.fingerprint_lmdb(train), overlap.fingerprint_lmdb(evaluation))
    found = {(match.train_index, match.eval_index) for match in matches}
    recall = sum((train_index, source) in found for train_index, source in sources.items()) / len(sources)
    false_flags = {match.train_index for match in matches if match.train_index not in sources}
    return recall, false_flags, matches


@pytest.fixture(scope="module")
def planted(synth, tmp_path_factory) -> tuple[Path, Path, dict[int, int]]:
    """The renderer's val split (33 crops) as the evaluation set; a training set of 30 of its train crops
    (other words, other fonts and backgrounds) and 6 copies of each of 20 val crops."""
    folder = tmp_path_factory.mktemp("overlap")
    eval_samples = read_lmdb(synth / "val")
    train_samples, sources = plant(eval_samples, read_lmdb(synth / "train")[:CLEAN_TRAIN])
    write_lmdb(folder / "eval", eval_samples)
    write_lmdb(folder / "train", train_samples)
    return folder / "train", folder / "eval", sources


def test_planted_copies_of_rendered_crops_are_found_and_other_crops_are_not(planted):
    train, evaluation, sources = planted
    recall, false_flags, matches = recall_and_false_flags(train, evaluation, sources)
    # Measured at the default thresholds: 119 of the 120; the one missed was cut 3 px off the left (docs/data.md).
    assert recall >= 0.9, recall
    assert false_flags == set()
    kinds = {(match.train_index, match.eval_index): match.kind for match in matches}
    byte_copies = [index for index in sources if (index - CLEAN_TRAIN - 1) % len(PLANTS) == 0]
    assert {kinds[(index, sources[index])] for index in byte_copies} == {overlap.IDENTICAL_BYTES}
    # Every planted copy keeps its label: each match is a same-label, near-identical pair.
    assert all(match.same_label for match in matches)


def render_word(word: str) -> bytes:
    """`word` in one font and size, dark on light, 32 pixels high: the hardest case for a hash, which only
    the letters tell apart."""
    font = ImageFont.load_default(size=28)  # Pillow's own font: the same on every machine
    left, top, right, bottom = font.getbbox(word)
    image = Image.new("L", (right - left + 8, bottom - top + 8), 235)
    ImageDraw.Draw(image).text((4 - left, 4 - top), word, font=font, fill=20)
    return jpeg(image.resize((round(image.width * 32 / image.height), 32), Image.Resampling.BILINEAR))


WORDS = (
    "apple bridge candle dragon eleven forest garden hollow island jungle kettle lantern meadow needle orange"
    " pepper quiver rabbit saddle timber umbrella velvet walnut yellow zipper anchor butter cactus donkey"
    " engine falcon goblet hammer insect jacket kitten ladder magnet napkin oyster"
).split()
OTHER_WORDS = (
    "parrot quartz rocket silver tomato unicorn violin window yogurt zebra almond basket carrot dolphin"
    " empire feather glider harbor iceberg jigsaw kernel lemon mirror nutmeg outlet pillow quince ribbon"
    " spider turtle uplift vessel wizard xylem yonder zircon acorn beacon cobalt dagger"
).split()


def test_different_words_in_one_font_are_not_flagged_and_their_copies_are(tmp_path):
    eval_samples = [(render_word(word), word) for word in WORDS]
    train_samples, sources = plant(eval_samples, [(render_word(word), word) for word in OTHER_WORDS])
    write_lmdb(tmp_path / "eval", eval_samples)
    write_lmdb(tmp_path / "train", train_samples)
    recall, false_flags, _ = recall_and_false_flags(tmp_path / "train", tmp_path / "eval", sources)
    assert recall >= 0.9, recall
    # 40 x 40 pairs of different words, one font, one size: none here; the measurement (docs/data.md) found 1
    # pair of 40,000 within the thresholds, so one is allowed.
    assert len(false_flags) <= 1, false_flags


def test_the_same_picture_in_another_format_is_identical_pixels_and_the_same_label_alone_is_nothing(tmp_path):
    picture = decoded(render_word("harbor"))
    write_lmdb(tmp_path / "eval", [(encoded(picture, "PNG"), "harbor"), (render_word("walnut"), "walnut")])
    # The same pixels as a BMP; and "walnut" again, drawn at another size and on another background.
    other = Image.new("L", (200, 60), 90)
    ImageDraw.Draw(other).text((10, 5), "walnut", font=ImageFont.load_default(size=44), fill=250)
    write_lmdb(tmp_path / "train", [(encoded(picture, "BMP"), "HARBOR"), (jpeg(other), "walnut")])
    matches = overlap.find_matches(
        overlap.fingerprint_lmdb(tmp_path / "train"), overlap.fingerprint_lmdb(tmp_path / "eval")
    )
    assert [(match.train_index, match.eval_index, match.kind, match.same_label) for match in matches] == [
        (1, 1, overlap.IDENTICAL_PIXELS, True)
    ]
    counts = overlap.count_matches(matches)
    assert counts["identical_pixels"] == 1 and counts["same_label"] == 1 and counts["flagged_train"] == 1


def coloured_word(word: str, ink: str, background: str, stretch: float = 1.0) -> bytes:
    font = ImageFont.load_default(size=28)
    left, top, right, bottom = font.getbbox(word)
    image = Image.new("RGB", (right - left + 8, bottom - top + 8), background)
    ImageDraw.Draw(image).text((4 - left, 4 - top), word, font=font, fill=ink)
    return jpeg(image.resize((round(image.width * stretch * 32 / image.height), 32), Image.Resampling.BILINEAR))


def test_the_same_word_in_other_colours_or_stretched_is_not_a_copy(tmp_path):
    """Grey hashes keep the letters and drop the colours: the same word in the same font on a red and on a
    blue sign hash alike, and a hash of a crop resized to 128 x 32 is blind to its width. The colour and
    aspect checks tell them apart, and leave a JPEG copy found."""
    blue = coloured_word("harbor", "white", (20, 40, 160))
    write_lmdb(tmp_path / "eval", [(blue, "harbor")])
    train = [
        (coloured_word("harbor", "white", (170, 30, 30)), "harbor"),
        (coloured_word("harbor", "white", (20, 40, 160), stretch=1.6), "harbor"),
        (jpeg(decoded(blue), 70), "harbor"),
    ]
    write_lmdb(tmp_path / "train", train)
    train_prints, eval_prints = (
        overlap.fingerprint_lmdb(tmp_path / "train"),
        overlap.fingerprint_lmdb(tmp_path / "eval"),
    )
    distances = overlap.hamming_distances(train_prints.ink_hashes, eval_prints.ink_hashes)[:, 0]
    assert distances[:2].max() <= overlap.DEFAULT_INK_THRESHOLD  # the hashes alone would flag both
    assert [match.train_index for match in overlap.find_matches(train_prints, eval_prints)] == [3]


def test_blocked_matching_finds_exactly_the_pairs_of_the_whole_distance_matrix(monkeypatch):
    generator = np.random.default_rng(0)
    left = generator.integers(0, 2**63, size=300, dtype=np.uint64)
    right = np.concatenate([left[:40] ^ np.uint64(0b1011), generator.integers(0, 2**63, size=200, dtype=np.uint64)])
    monkeypatch.setattr(overlap, "ROW_BLOCK", 7)  # blocks that do not divide the rows
    rows, columns, distances = overlap.near_pairs(left, right, 12)
    bits = np.array([[bin(int(a) ^ int(b)).count("1") for b in right] for a in left])
    expected_rows, expected_columns = np.nonzero(bits <= 12)
    assert rows.tolist() == expected_rows.tolist() and columns.tolist() == expected_columns.tolist()
    assert distances.tolist() == bits[expected_rows, expected_columns].tolist()
    assert len(rows) >= 40


def test_json_pairs_and_filtered_copy(planted, tmp_path, capsys):
    train, evaluation, sources = planted
    out = tmp_path / "out"
    out.mkdir()
    code = check_overlap.main(
        [str(train), "--against", str(evaluation), "--json", str(out / "overlap.json"), "--pairs",
         str(out / "pairs.png"), "--write-filtered", str(out / "filtered"), "--examples", "3"]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    matches = overlap.find_matches(overlap.fingerprint_lmdb(train), overlap.fingerprint_lmdb(evaluation))
    flagged = overlap.flagged_indices(matches)

    report = json.loads((out / "overlap.json").read_text(encoding="utf-8"))
    assert (report["whole_threshold"], report["ink_threshold"]) == (4, 8)
    assert report["images"] == {str(train): CLEAN_TRAIN + PLANTED_SOURCES * len(PLANTS), str(evaluation): 33}
    [pair] = report["pairs"]
    assert (pair["train"], pair["eval"]) == (str(train), str(evaluation))
    assert pair["counts"] == overlap.count_matches(matches)
    assert pair["counts"]["identical_bytes"] == PLANTED_SOURCES
    assert pair["counts"]["flagged_train"] == len(flagged) >= 0.9 * len(sources)
    assert 1 <= len(pair["examples"]) <= 3
    for example in pair["examples"]:
        assert sources[example["train_index"]] == example["eval_index"]
        assert example["train_label"] == example["eval_label"]
    assert f"{len(flagged)} of {CLEAN_TRAIN + len(sources)} samples flagged" in printed

    with Image.open(out / "pairs.png") as picture:
        assert picture.format == "PNG" and picture.width > 600 and picture.height > 64
        picture.load()  # decodes the whole file: a truncated PNG raises
    assert sorted(path.name for path in out.iterdir()) == ["filtered", "overlap.json", "pairs.png"]  # no leftovers

    env = open_lmdb(out / "filtered")  # the project's reader
    try:
        with env.begin() as txn:
            kept = CLEAN_TRAIN + len(sources) - len(flagged)
            assert read_num_samples(txn, out / "filtered") == kept
            assert read_label(txn, kept) is not None and read_label(txn, kept + 1) is None
    finally:
        env.close()
    original = read_lmdb(train)
    assert read_lmdb(out / "filtered") == [
        sample for index, sample in enumerate(original, start=1) if index not in flagged
    ]
    assert f"wrote {kept} samples of {train} to {out / 'filtered'}, leaving out {len(flagged)} flagged" in printed


@pytest.fixture(scope="module")
def small_sets(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("small")
    write_lmdb(folder / "train", [(render_word(word), word) for word in WORDS[:3]])
    write_lmdb(folder / "eval", [(render_word(word), word) for word in WORDS[:2]])
    return folder / "train", folder / "eval"


BAD_INPUTS = {
    "a folder that is not an LMDB": (["{plain}", "--against", "{eval}"], ["{plain}", "holds no data.mdb"]),
    "a path that does not exist": (["{train}", "--against", "{missing}"], ["{missing}", "does not exist"]),
    "a file": (["{train}", "--against", "{file}"], ["{file}", "is a file"]),
    "an empty LMDB": (["{empty}", "--against", "{eval}"], ["{empty}", "holds no samples"]),
    "--json in a missing folder": (
        ["{train}", "--against", "{eval}", "--json", "{missing}/o.json"],
        ["--json", "{missing} does not exist"],
    ),
    "--pairs in a missing folder": (
        ["{train}", "--against", "{eval}", "--pairs", "{missing}/o.png"],
        ["--pairs", "{missing} does not exist"],
    ),
    "--pairs not a PNG": (["{train}", "--against", "{eval}", "--pairs", "{tmp}/o.jpg"], ["--pairs", ".png"]),
    "--write-filtered in a missing folder": (
        ["{train}", "--against", "{eval}", "--write-filtered", "{missing}/out"],
        ["--write-filtered", "{missing} does not exist"],
    ),
    "--write-filtered over an existing LMDB": (
        ["{train}", "--against", "{eval}", "--write-filtered", "{eval}"],
        ["--write-filtered", "one of the LMDBs read"],
    ),
    "--write-filtered with several training sets": (
        ["{train}", "{eval}", "--against", "{eval}", "--write-filtered", "{tmp}/out"],
        ["--write-filtered takes one training set, 2 were given"],
    ),
    "--threshold above 64": (["{train}", "--against", "{eval}", "--threshold", "65"], ["--threshold 65", "0 to 64"]),
    "--whole-threshold below 0": (
        ["{train}", "--against", "{eval}", "--whole-threshold", "-1"],
        ["--whole-threshold -1", "0 to 64"],
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_input_is_refused_naming_it_with_nothing_written(case, small_sets, tmp_path):
    train, evaluation = small_sets
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("not an LMDB")
    write_lmdb(tmp_path / "empty", [])
    names = {
        "train": train,
        "eval": evaluation,
        "plain": tmp_path / "plain",
        "missing": tmp_path / "missing",
        "file": tmp_path / "file",
        "empty": tmp_path / "empty",
        "tmp": tmp_path,
    }
    argv, fragments = BAD_INPUTS[case]
    before = sorted(tmp_path.iterdir())
    with pytest.raises(check_overlap.BadInput) as refused:  # cli.run makes it one line and exit code 1
        check_overlap.main([part.format(**names) for part in argv])
    for fragment in fragments:
        assert fragment.format(**names) in str(refused.value), (fragment, str(refused.value))
    assert sorted(tmp_path.iterdir()) == before


def test_the_command_exits_1_with_one_line_and_no_traceback(small_sets, tmp_path):
    train, evaluation = small_sets
    result = run_command(sys.executable, SCRIPT, train, "--against", evaluation, "--threshold", "99")
    one_line_error(result, "error: --threshold 99: out of range; give a number of bits from 0 to 64")
    assert result.stdout == ""  # refused before any hashing
    result = run_command(sys.executable, SCRIPT, train, "--against", evaluation, check=True)
    assert "same bytes" in result.stdout and "2 of 3 samples flagged" in result.stdout  # 2 rendered alike
