from __future__ import annotations

import pytest

from data.transforms import Preprocessing
from tests.conftest import REPO
from training.config import ConfigError, config_warnings, from_dict, load_config, to_dict, validate


@pytest.mark.parametrize("name", sorted(path.name for path in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_config_is_valid(name):
    validate(load_config(name, []))


def test_bare_name_is_found_in_configs_and_defaults_are_valid():
    config = load_config("crnn.yaml", [])
    validate(config)
    assert config.train.batch_size == 32
    assert load_config("crnn", []).data.alphabet == config.data.alphabet


def test_overrides_use_dotted_keys_and_yaml_values():
    config = load_config(
        "crnn.yaml",
        [
            "optim.lr=3e-4",
            "data.train=[datasets/a,datasets/b]",
            "train.max_steps=7",
            "data.keep_aspect=true",
            "data.alphabet=0123",
        ],
    )
    assert config.optim.lr == pytest.approx(3e-4)
    assert config.data.train == ["datasets/a", "datasets/b"]
    assert config.train.max_steps == 7 and config.data.keep_aspect is True
    assert config.data.alphabet == "0123"  # a string option keeps the text: not the int 123


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1", "optim.lrr"),
        ("nosuch.key=1", "nosuch"),
        ("train.max_steps=many", "train.max_steps"),
        ("train.batch_size=1.5", "train.batch_size"),
        ("data.keep_aspect=maybe", "data.keep_aspect"),
        ("device_ids=[a]", r"device_ids\[0\]"),
        ("train=3", "section"),
        ("no_equals_sign", "key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("crnn.yaml", [override])


def test_unknown_key_in_a_yaml_file_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  batch_size: 8\n  max_step: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*train.max_step"):
        load_config(str(path), [])


@pytest.mark.parametrize(
    "override",
    ["train.precision=fp8", "data.eval_width_step=-8", "data.num_workers=-1", "data.unknown_characters=keep"],
)
def test_validate_rejects_bad_choices(override):
    config = load_config("crnn.yaml", [override])
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        validate(config)


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("nope.yaml", [])


def test_dict_round_trip():
    config = load_config("crnn.yaml", ["train.max_steps=11"])
    assert from_dict(to_dict(config)) == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.interpolation=area"], r"data.interpolation: 'area' is not one of nearest, bilinear"),
        (["data.mean=[0.5,0.5]"], r"data.mean=\[0.5, 0.5\]: give 1 value, or one per channel \(1\)"),
        (["data.std=[0.0]"], r"data.std\[0\]=0.0: must be from 1e-06 to 1000"),
        (
            ["model.in_channels=3", "data.std=[0.2,0.2]"],
            r"data.std=\[0.2, 0.2\]: give 1 value, or one per channel \(3\)",
        ),
    ],
)
def test_preprocessing_keys_are_checked(overrides, message):
    config = load_config("crnn.yaml", overrides)
    with pytest.raises(ConfigError, match=message):
        validate(config)
    validate(load_config("crnn.yaml", ["model.in_channels=3", "data.mean=[0.485,0.456,0.406]", "data.std=[0.229]"]))


@pytest.mark.parametrize("tuning", ["finetune_real.yaml", "finetune_easyocr.yaml"])
def test_a_fine_tuning_config_fits_its_half_hour_on_any_cpu(tuning):
    # Measured in 30 minutes on CPUs with bf16; without it train.max_steps alone would take an hour or more.
    minutes = load_config(tuning, []).train.max_minutes
    assert minutes is not None and minutes <= 27


@pytest.mark.parametrize(
    "tuning, start", [("finetune_real.yaml", "crnn.yaml"), ("finetune_easyocr.yaml", "easyocr_en.yaml")]
)
def test_a_fine_tuning_config_builds_the_network_and_input_of_the_config_it_starts_from(tuning, start):
    # train.init_from loads the start's checkpoint: a model key or an input key that drifted apart would
    # load only some tensors, or feed the weights images they were not trained on.
    tuned, started = load_config(tuning, []), load_config(start, [])
    assert tuned.model == started.model
    assert Preprocessing.from_config(tuned) == Preprocessing.from_config(started)
    keys = ("alphabet", "fold_case", "eval_width_step")
    assert [getattr(tuned.data, key) for key in keys] == [getattr(started.data, key) for key in keys]


@pytest.mark.parametrize("workers, expected", [("auto", "auto"), ("'auto'", "auto"), ("3", 3), ("0", 0)])
def test_num_workers_takes_a_number_or_auto_and_a_checkpoint_keeps_auto(workers, expected):
    config = load_config("crnn.yaml", [f"data.num_workers={workers}"])
    validate(config)
    assert config.data.num_workers == expected and type(config.data.num_workers) is type(expected)
    assert from_dict(to_dict(config)) == config  # auto is resolved again where a run resumes, not stored resolved


def test_num_workers_auto_in_a_yaml_file(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("data:\n  num_workers: auto\n")
    assert load_config(str(path), []).data.num_workers == "auto"


@pytest.mark.parametrize("workers", ["lots", "2.5", "AUTO", "true"])
def test_a_bad_num_workers_is_named_with_what_it_takes(workers):
    with pytest.raises(ConfigError, match=rf"'data.num_workers' must be an integer or auto, got '{workers}'"):
        load_config("crnn.yaml", [f"data.num_workers={workers}"])


def test_a_cpu_time_limit_on_a_gpu_points_at_the_gpu_recipe():
    # Said at start-up, not changed: the run trains the config it was given.
    config = load_config("crnn.yaml", [])
    assert config_warnings(config, "cpu") == []
    [warning] = config_warnings(config, "cuda")
    assert warning.startswith("train.max_minutes=14 on a GPU: a time limit is a CPU recipe's")
    assert "configs/crnn_gpu.yaml" in warning
    assert config_warnings(load_config("crnn_gpu.yaml", []), "cuda") == []
