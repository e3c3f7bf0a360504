"""Training-time augmentation: seeded per sample, off in validation, evaluation and prediction."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

from data.augment import AUGMENTATIONS, LEVELS, PROBABILITIES, Augmentation, affine, homography, warp
from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset, SeededSamples
from data.samplers import GlobalBatchSampler
from data.transforms import ImageTransform, Preprocessing
from tests.conftest import ALPHABET, REPO, read_lmdb, run_env, write_images
from training.checkpoint import load_checkpoint, load_model, save_checkpoint
from training.config import AugmentConfig, ConfigError, load_config, validate


def test_levels_set_the_probabilities_and_the_augment_section_overrides_them():
    assert Augmentation.from_config("none", {}) is None
    light = Augmentation.from_config("light", {"blur": 0.0, "invert": None})
    assert light.probabilities == {**PROBABILITIES["light"], "blur": 0.0}
    assert Augmentation.from_config("none", {"noise": 0.5}).probabilities == {**PROBABILITIES["none"], "noise": 0.5}
    config = load_config("crnn.yaml", ["data.augment=strong", "augment.blur=0.9", "augment.invert=null"])
    assert config.augment.blur == 0.9 and config.augment.invert is None
    validate(config)
    for override, message in (
        ("data.augment=heavy", "data.augment: 'heavy' is not one of none, light, strong"),
        ("augment.blur=1.5", r"augment.blur=1.5: must be from 0 to 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            validate(load_config("crnn.yaml", [override]))


def test_the_augment_section_has_a_key_for_each_entry_of_the_table():
    assert [item.name for item in dataclasses.fields(AugmentConfig)] == [step.name for step in AUGMENTATIONS]
    assert list(PROBABILITIES) == list(LEVELS)


@pytest.mark.slow
def test_an_augmentation_added_to_the_table_is_configured_and_applied_with_no_other_change(synth):
    """What a fork writes: one entry in data/augment.py's table. Its `augment.<name>` key is then read,
    checked and applied, with no line changed anywhere else."""
    script = '''if True:
        import pathlib, sys, types, torch
        # The fork's data/augment.py: this one with one entry more, imported before anything reads it.
        entry = """AUGMENTATIONS = (
            AugmentationStep("erase", probability={"none": 0.0, "light": 0.0, "strong": 0.0},
                             apply=lambda pixels, strength, generator: pixels.index_fill(2, torch.arange(8), 0)),"""
        source = pathlib.Path("data/augment.py").read_text().replace("AUGMENTATIONS = (", entry, 1)
        sys.modules["data.augment"] = fork = types.ModuleType("data.augment")
        exec(compile(source, "data/augment.py", "exec"), fork.__dict__)
        from data.transforms import build_transform
        from training.config import ConfigError, load_config, validate
        config = load_config("crnn.yaml", ["data.augment=none", "augment.erase=1"])
        validate(config)
        transform = build_transform(config, train=True)
        assert transform.augmentation.probabilities == {**fork.PROBABILITIES["none"], "erase": 1.0}
        image = pathlib.Path(sys.argv[1]).read_bytes()
        assert not torch.equal(transform(image, augment_seed=1), transform(image))
        try:
            validate(load_config("crnn.yaml", ["augment.erase=2"]))
        except ConfigError as error:
            print(error)
    '''
    image = write_images(synth, synth.parent / "erase", 1)[0]
    result = subprocess.run(
        [sys.executable, "-c", script, str(image)], cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "augment.erase=2.0: must be from 0 to 1"


@pytest.mark.slow
def test_a_sample_s_augmentation_depends_on_its_seed_alone(synth):
    image_bytes = read_lmdb(synth / "train")[0][0]
    plain = ImageTransform(Preprocessing(32, 100))
    strong = ImageTransform(Preprocessing(32, 100), augmentation=Augmentation.from_config("strong", {}))
    torch.manual_seed(123)
    global_state = torch.get_rng_state()
    first, again = strong(image_bytes, augment_seed=7), strong(image_bytes, augment_seed=7)
    assert torch.equal(torch.get_rng_state(), global_state)  # drawn from the sample's seed, not global state
    assert torch.equal(first, again)
    others = [strong(image_bytes, augment_seed=seed) for seed in range(8, 16)]
    assert sum(not torch.equal(first, other) for other in others) >= 6  # most seeds draw some transform
    assert torch.equal(strong(image_bytes), plain(image_bytes))  # no seed (evaluation): no augmentation
    assert first.shape == plain(image_bytes).shape and first.min() >= -1 and first.max() <= 1


def test_geometry_fills_the_corners_it_uncovers_with_the_image_s_own_border_colour():
    """Each image's own border colour, whichever images came before it; every draw from the sample's seed."""
    every = {name: 0.0 for name in PROBABILITIES["strong"]}
    images = [torch.full((1, 32, 100), value) for value in (0.0, 1.0, 0.3)]
    for image in images:
        image[:, 12:20, 20:80] = 1 - image[:, 12:20, 20:80]  # a "word" across the middle
    for geometry in ("affine", "perspective"):
        augmentation = Augmentation("strong", every | {geometry: 1.0})
        outputs = [augmentation(image.clone(), seed=3) for image in images + images]
        for image, output, again in zip(images, outputs, outputs[3:]):
            assert torch.equal(output, again)
            assert not torch.equal(output, image)
            assert output[0, [0, 0, -1, -1], [0, -1, 0, -1]].eq(image[0, 0, 0]).all(), geometry  # corners: its border
            word, background = image[0, 16, 50], image[0, 0, 0]
            assert output[0, 14:18, 30:70].sub(word).abs().mean() < (word - background).abs() / 2  # still there


def test_an_identity_warp_returns_the_image_and_a_shift_moves_it():
    image = torch.rand(3, 32, 100)
    assert torch.allclose(warp(image, ((1, 0, 0), (0, 1, 0), (0, 0, 1))), image, atol=1e-5)
    # Sampling the source 3 pixels to the right moves the content 3 pixels to the left.
    moved = warp(image, ((1, 0, 3), (0, 1, 0), (0, 0, 1)))
    assert torch.allclose(moved[:, :, :97], image[:, :, 3:], atol=1e-5)


def test_the_affine_moves_the_content_as_its_strength_says_about_the_centre():
    image = torch.zeros(1, 32, 100)
    image[0, 15:17, 69:71] = 1  # a dot 20 pixels right of the centre (50, 16)
    generator = torch.Generator()
    still = {"degrees": 0, "shear": 0, "scale": (1, 1), "translate": (0, 0)}
    assert torch.allclose(affine(image, still, generator), image, atol=1e-5)
    half = affine(image, still | {"scale": (0.5, 0.5)}, generator)  # the content shrinks towards the centre
    assert half[0].sum(dim=0).argmax().item() in (59, 60) and half[0].sum(dim=1).argmax().item() in (15, 16)


def test_every_transform_takes_an_image_resized_to_one_or_two_pixels_wide():
    """A tall crop resized to the model's height can be that narrow; torchvision's blur refused it."""
    every = Augmentation("strong", {name: 1.0 for name in PROBABILITIES["strong"]})
    for width in (1, 2, 3):
        output = every(torch.rand(1, 32, width), seed=width)
        assert output.shape == (1, 32, width) and output.min() >= 0 and output.max() <= 1


def test_a_perspective_homography_takes_each_corner_where_it_was_asked():
    moved = np.array([[3.0, 2.0], [95.0, 1.0], [97.0, 30.0], [1.0, 31.0]])
    corners = np.array([[0.0, 0.0], [100.0, 0.0], [100.0, 32.0], [0.0, 32.0]])
    matrix = np.array(homography(moved, corners))
    for point, corner in zip(moved, corners):
        x, y, depth = matrix @ [*point, 1]
        assert np.allclose([x / depth, y / depth], corner)


def test_training_samples_are_augmented_the_same_for_any_number_of_processes(synth):
    """Rank 1 of 2 gets the second half of each global batch, augmented exactly as one process would."""
    codec = CTCCodec(ALPHABET, fold_case=True)
    transform = ImageTransform(Preprocessing(32, 100), augmentation=Augmentation.from_config("strong", {}))
    samples = SeededSamples([LmdbDataset(synth / "train", codec, 26, transform)])

    def batches(rank: int, world_size: int) -> list[torch.Tensor]:
        sampler = GlobalBatchSampler([len(samples)], 8, rank, world_size, seed=0)
        sampler.set_steps(3, 5)
        return [torch.stack([samples[item][0] for item in batch]) for batch in sampler]

    whole, second_half = batches(0, 1), batches(1, 2)
    for full, half in zip(whole, second_half):
        assert torch.equal(full[4:], half)
    plain = ImageTransform(Preprocessing(32, 100))
    dataset = LmdbDataset(synth / "train", codec, 26, plain)
    sampler = GlobalBatchSampler([len(samples)], 8, 0, 1, seed=0)
    sampler.set_steps(3, 4)
    [batch] = list(sampler)
    assert not torch.equal(whole[0], torch.stack([dataset[index][0] for index, _ in batch]))


@pytest.fixture(scope="module")
def strongly_augmented(tiny_run, tmp_path_factory):
    """tiny_run's best.pt, its config saying it trained with strong augmentation and every probability 1."""
    checkpoint = load_checkpoint(tiny_run / "best.pt")
    checkpoint["config"]["data"]["augment"] = "strong"
    checkpoint["config"]["augment"] = {name: 1.0 for name in PROBABILITIES["strong"]}
    path = tmp_path_factory.mktemp("augmented") / "best.pt"
    save_checkpoint(path, checkpoint)
    return path


@pytest.mark.slow
def test_prediction_and_evaluation_never_augment(strongly_augmented, synth, tmp_path):
    samples = read_lmdb(synth / "val")[:5]
    paths = write_images(synth, tmp_path, 5)
    model, codec, _, preprocessing = load_model(strongly_augmented)
    with torch.inference_mode():
        expected = codec.decode(model(torch.stack([ImageTransform(preprocessing)(image) for image, _ in samples])))
    result = subprocess.run(
        [sys.executable, "scripts/predict.py", str(strongly_augmented), *map(str, paths), "--precision", "fp32"],
        cwd=REPO,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    read = [line.split("\t") for line in result.stdout.splitlines()]
    assert [float(confidence) for _, _, confidence, _ in read] == pytest.approx(
        [r.confidence for r in expected], abs=1.5e-4
    )

    dumps = {}
    for name, checkpoint in (("augmented", strongly_augmented), ("plain", strongly_augmented.parent / "plain.pt")):
        if name == "plain":
            plain = load_checkpoint(strongly_augmented)
            plain["config"]["data"]["augment"] = "none"
            save_checkpoint(checkpoint, plain)
        dumps[name] = tmp_path / f"{name}.tsv"
        evaluated = subprocess.run(
            [
                "bash",
                "scripts/eval.sh",
                str(checkpoint),
                str(synth / "val"),
                "--dump",
                str(dumps[name]),
                "--precision",
                "fp32",
            ],
            cwd=REPO,
            env={**run_env(), "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert evaluated.returncode == 0, evaluated.stderr
    assert dumps["augmented"].read_text() == dumps["plain"].read_text()
