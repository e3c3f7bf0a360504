from __future__ import annotations

import pytest
import torch

from data.alphabet import load_alphabet
from data.codec import CTCCodec, ctc_min_frames, fold_case


def one_hot_logits(frames: list[int], num_classes: int, peak: float = 10.0) -> torch.Tensor:
    logits = torch.zeros(1, len(frames), num_classes)
    for t, cls in enumerate(frames):
        logits[0, t, cls] = peak
    return logits


def test_encode_is_blank_free_and_one_based():
    codec = CTCCodec("abc")
    targets, lengths = codec.encode(["cab", "a"])
    assert targets.tolist() == [3, 1, 2, 1]
    assert lengths.tolist() == [3, 1]
    assert codec.num_classes == 4


def test_greedy_decode_collapses_repeats_and_drops_blanks():
    codec = CTCCodec("abc")
    # a a - b - b b - c  ->  "abbc": a blank separates the two b's, so both survive.
    logits = one_hot_logits([1, 1, 0, 2, 0, 2, 2, 0, 3], codec.num_classes)
    [reading] = codec.decode(logits)
    assert reading.text == "abbc"
    p = torch.softmax(logits[0, 0], -1).max().item()
    assert reading.char_probs == pytest.approx([p] * 4)  # one probability per emitted character


def test_a_characters_probability_is_the_highest_of_its_frames_and_the_word_is_easyocrs_adjusted_product():
    codec = CTCCodec("ab")
    logits = one_hot_logits([1, 1, 0, 2], codec.num_classes)
    logits[0, 0, 1], logits[0, 1, 1], logits[0, 3, 2] = 1.0, 3.0, 2.0  # a's second frame is its surer one
    probs = torch.softmax(logits[0], -1)
    [reading] = codec.decode(logits)
    assert reading.text == "ab"
    assert reading.char_probs == pytest.approx([probs[1, 1].item(), probs[3, 2].item()])
    a, b = probs[1, 1].item(), probs[3, 2].item()
    assert reading.confidence == pytest.approx((a * b) ** (2 / 2**0.5))  # prod ** (2 / sqrt(n)), n = 2


def test_an_empty_reading_has_confidence_zero_not_one():
    codec = CTCCodec("ab")
    [reading] = codec.decode(one_hot_logits([0, 0, 0], codec.num_classes))
    assert reading.text == "" and reading.char_probs == () and reading.confidence == 0.0


def test_round_trip_through_a_perfect_alignment():
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    codec = CTCCodec(alphabet)
    for word in ["hello", "aa", "a", "0z9y", "mississippi"]:
        targets, _ = codec.encode([word])
        frames = []
        for cls in targets.tolist():  # blank between every pair, as CTC needs for repeats
            frames += [cls, 0]
        assert codec.decode(one_hot_logits(frames, codec.num_classes))[0].text == word


def test_fold_case_lowercases_labels():
    codec = CTCCodec("abc", fold_case=True)
    assert codec.normalize("CaB") == "cab"
    assert CTCCodec("abcABC").normalize("CaB") == "CaB"


def test_fold_case_keeps_each_characters_count_as_lower_does():
    """casefold would make `ß` two characters, and a label longer than the one stored."""
    assert fold_case("STRAßE") == "straße"
    assert CTCCodec("aerstß", fold_case=True).normalize("STRAßE") == fold_case("STRAßE")


def test_ctc_min_frames_counts_repeats():
    assert ctc_min_frames("abc") == 3
    assert ctc_min_frames("aab") == 4
    assert ctc_min_frames("aaa") == 5


def test_duplicate_characters_are_an_error():
    with pytest.raises(ValueError, match="appears twice"):
        CTCCodec("abca")
    with pytest.raises(ValueError, match="appears twice"):
        load_alphabet("xyzx")


def test_alphabet_file_with_thousands_of_characters(tmp_path):
    characters = [chr(0x4E00 + i) for i in range(5530)] + [" "]
    path = tmp_path / "chinese.txt"
    path.write_text("\n".join(characters) + "\n", encoding="utf-8")
    alphabet = load_alphabet(str(path))
    assert len(alphabet) == 5531 and alphabet[-1] == " "
    codec = CTCCodec(alphabet)
    targets, _ = codec.encode([characters[5000] + characters[1]])
    assert targets.tolist() == [5001, 2]


def test_alphabet_file_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("a\nbc\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        load_alphabet(str(path))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_alphabet(str(tmp_path / "missing.txt"))


@pytest.mark.parametrize("line", ["<blank>", "[blank]", "<BLANK>", "blank", "<pad>", "[PAD]", "<eps>", ""])
def test_alphabet_file_listing_the_ctc_blank_is_an_error_that_says_why(tmp_path, line):
    path = tmp_path / "with_blank.txt"
    path.write_text(f"a\n{line}\nb\n", encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=r"with_blank.txt:2: .*the CTC blank is class 0, added by the codec, and must "
        r"not be listed: delete the line",
    ):
        load_alphabet(str(path))


def test_alphabet_file_errors_name_the_line_of_a_duplicate(tmp_path):
    path = tmp_path / "twice.txt"
    path.write_text("a\nb\nc\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"twice.txt:4: character 'b' appears twice \(first at line 2\)"):
        load_alphabet(str(path))


@pytest.mark.parametrize(
    "alphabet, position, char",
    [
        ("ab\x00c", 2, r"'\\x00' \(U\+0000\)"),
        ("\x07abc", 0, r"'\\x07' \(U\+0007\)"),
        ("ab\tc", 2, r"'\\t' \(U\+0009\)"),
        ("ab\nc", 2, r"'\\n' \(U\+000A\)"),
    ],
)
def test_control_characters_in_an_inline_alphabet_are_named_with_their_position(alphabet, position, char):
    with pytest.raises(ValueError, match=rf"data.alphabet: position {position}: control character {char} cannot be"):
        load_alphabet(alphabet)
    with pytest.raises(ValueError, match=rf"position {position}: control character"):
        CTCCodec(alphabet)


def test_control_character_in_an_alphabet_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "nul.txt"
    path.write_text("a\n\x00\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"nul.txt:2: control character '\\x00'"):
        load_alphabet(str(path))
