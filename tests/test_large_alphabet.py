"""Large alphabets given as files: glyph coverage in the generator, and training end to end.

This machine's fonts are DejaVu only, so the alphabet trained here is configs/alphabets/
latin_greek_cyrillic.txt (367 characters DejaVu has); the CJK alphabet of configs/cjk.yaml is only
loaded, and its hanzi checked to be reported as undrawable when the system has no CJK font.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.alphabet import load_alphabet
from synthetic.fonts import find_fonts, plan_fonts
from synthetic.render import RenderPlan, render_sample
from synthetic.text import TextSampler, folds_case
from tests.conftest import REPO, SMALL_RUN, read_lmdb, run_command
from training.checkpoint import classifier_keys
from training.config import load_config

SCRIPT = REPO / "scripts" / "make_synthetic.py"
LATIN_GREEK_CYRILLIC = "configs/alphabets/latin_greek_cyrillic.txt"


def test_the_alphabet_files_load_and_the_cjk_config_names_one():
    alphabet = load_alphabet(str(REPO / LATIN_GREEK_CYRILLIC))
    assert len(alphabet) == 367 and {"a", "Z", "é", "Ł", "Ω", "ж", "Ё"} <= set(alphabet)
    config = load_config(str(REPO / "configs" / "cjk.yaml"), [])
    cjk = load_alphabet(str(REPO / config.data.alphabet))
    assert len(cjk) == 3817 and cjk[:10] == "0123456789" and {"中", "国", "啊"} <= set(cjk)
    assert config.data.fold_case is False


def test_each_text_is_drawn_with_a_font_that_has_all_its_characters():
    fonts = {Path(font.path).name: font for font in find_fonts()}
    if not {"DejaVuSerif.ttf", "DejaVuSansMono.ttf"} <= set(fonts):
        pytest.skip("needs DejaVu Serif and DejaVu Sans Mono")
    # DejaVu Sans Mono has Arabic and no 'ǅ', DejaVu Serif the other way round; no font has '中'.
    pair = (fonts["DejaVuSerif.ttf"], fonts["DejaVuSansMono.ttf"])
    alphabet = "abǅب中"
    plan = plan_fonts(pair, alphabet, (), folds_case(alphabet))
    serif, mono = plan.train
    if not (
        "ǅ" in serif.characters
        and "ب" not in serif.characters
        and "ب" in mono.characters
        and "ǅ" not in mono.characters
    ):
        pytest.skip("these DejaVu versions do not split the coverage as this test needs")
    assert plan.missing == "中" and plan.alphabet == "abǅب"
    render_plan = RenderPlan(plan, TextSampler(plan.alphabet, (), 8))
    samples = [render_sample(render_plan, 0, "train", index) for index in range(60)]
    by_family = {coverage.font.family: coverage for coverage in plan.train}
    assert all(by_family[sample.meta["font"]].draws(sample.label) for sample in samples)
    labels = [sample.label for sample in samples]
    assert not any("ǅ" in label and "ب" in label for label in labels)  # no one font draws both
    assert any("ǅ" in label for label in labels) and any("ب" in label for label in labels)


def test_generator_reports_characters_no_font_has(tmp_path):
    alphabet_file = tmp_path / "mixed.txt"
    alphabet_file.write_text("\n".join("abcdefghij中文") + "\n", encoding="utf-8")
    result = run_command(
        sys.executable,
        SCRIPT,
        "--out",
        tmp_path / "synth",
        "--train",
        "20",
        "--val",
        "4",
        "--test",
        "0",
        "--workers",
        "1",
        "--alphabet",
        alphabet_file,
        cwd=None,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    labels = "".join(label for _, label in read_lmdb(tmp_path / "synth" / "train"))
    if "are in no font" in result.stdout:  # this machine has no CJK font
        assert "2 of the alphabet's 12 characters are in no font and are never drawn: '中' '文'" in result.stdout
        assert "no CJK font has them: install fonts-noto-cjk" in result.stdout
        assert set(labels) <= set("abcdefghij")
    else:
        assert set(labels) & set("中文")


@pytest.mark.slow
def test_training_on_a_file_alphabet_of_367_characters(tmp_path):
    data = tmp_path / "data"
    generated = run_command(
        sys.executable,
        SCRIPT,
        "--out",
        data,
        "--train",
        "48",
        "--val",
        "16",
        "--test",
        "0",
        "--workers",
        "1",
        "--alphabet",
        LATIN_GREEK_CYRILLIC,
        timeout=120,
    )
    assert generated.returncode == 0, generated.stderr
    labels = "".join(label for _, label in read_lmdb(data / "train"))
    assert set(labels) - set(
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    ), "the samples should hold Greek, Cyrillic or accented letters"

    run = tmp_path / "run"
    command = [
        sys.executable,
        "train.py",
        "--config",
        "configs/cjk.yaml",
        f"data.alphabet={LATIN_GREEK_CYRILLIC}",
        f"data.train=[{data / 'train'}]",
        f"data.val=[{data / 'val'}]",
        f"train.out_dir={run}",
        *SMALL_RUN,
        "train.max_steps=3",
        "train.eval_every=3",
    ]
    trained = run_command(*command)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    output = trained.stdout + trained.stderr
    assert "kept 48 of 48" in output and "kept 16 of 16" in output  # no label fell outside the file's alphabet

    alphabet = load_alphabet(str(REPO / LATIN_GREEK_CYRILLIC))
    checkpoint = torch.load(run / "last.pt", map_location="cpu", weights_only=True)
    assert checkpoint["alphabet"] == alphabet
    [weight, _] = classifier_keys(checkpoint["model"], len(alphabet) + 1)
    assert checkpoint["model"][weight].shape == (len(alphabet) + 1, 64)  # [num_classes, 2 * hidden_size]

    plotted = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "plot.py"), str(run)], capture_output=True, text=True, timeout=60
    )
    assert plotted.returncode == 0, plotted.stderr
    assert (run / "curves.png").is_file()
