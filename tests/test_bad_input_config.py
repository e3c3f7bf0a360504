"""Round 3 of bad input (issue 28), config and launch: what was typed is what is used, and no hang at start-up.

Values in YAML files and on the command line mean what they read as, or are refused with what to write;
`~` is the home folder in every path key; keys that contradict each other are refused; labels and
alphabets meet in one Unicode form; a stale launch environment is refused and every rendezvous is bounded.
"""

from __future__ import annotations

import io
import re
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from datetime import timedelta
from pathlib import Path

import pytest
from PIL import Image

from data.alphabet import load_alphabet
from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset
from data.lmdb_writer import write_lmdb
from data.transforms import build_transform
from tests.conftest import REPO, SMALL_RUN, TORCHRUN_TWO_UNTIL_EACH_FAILS, one_line_error, run_command, run_env
from training.config import ConfigError, load_config, path_keys, validate
from utils.distributed import join_store, read_env, threads_per_process


def train(*arguments: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """train.py, by its full path: `cwd` may be elsewhere."""
    return run_command(sys.executable, REPO / "train.py", *arguments, cwd=cwd, env=env, timeout=180)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- what was typed is what is used ----------------------------------------------------------------


@pytest.mark.parametrize(
    "key, text, message",
    [
        (
            "train.max_steps",
            "017",
            "train.max_steps=017 is ambiguous (a leading 0 makes it octal in YAML 1.1; PyYAML "
            "alone reads 15); write 17, or 15 if you meant octal",
        ),
        ("train.max_steps", "0x1F", "write 31"),
        ("train.max_steps", "0o17", "write 15"),
        ("train.max_steps", "1:30", "YAML 1.1 reads numbers with ':' in base 60; PyYAML alone reads 90"),
        ("train.max_steps", "1_000", "write 1000"),
        ("optim.lr", "1_0.5", "write 10.5"),
        (
            "data.keep_aspect",
            "on",
            "data.keep_aspect=on is ambiguous (YAML 1.1 reads yes/no/on/off as true/false; "
            "PyYAML alone reads True); write true or false",
        ),
        ("data.fold_case", "no", "write true or false"),
        ("model.lstm_layers", "02", "write 2, or quote it for the text"),
        ("train.max_steps", "1e3", "'train.max_steps' must be an integer (write 1000), got '1e3'"),
    ],
)
@pytest.mark.parametrize("where", ["file", "command line"])
def test_a_value_yaml_1_1_reads_otherwise_is_refused_with_what_to_write(tmp_path, key, text, message, where):
    section, name = key.split(".")
    if where == "file":
        path = tmp_path / "typed.yaml"
        path.write_text(f"{section}:\n  {name}: {text}\n")
        with pytest.raises(ConfigError, match=f"^{path}: ") as raised:
            load_config(str(path), [])
    else:
        with pytest.raises(ConfigError, match="^command line: ") as raised:
            load_config("crnn.yaml", [f"{key}={text}"])
    assert message in str(raised.value)


def test_values_read_as_a_person_reads_them_in_files_and_on_the_command_line(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(
        "data:\n  alphabet: 0123456789\n  index_cache: off\n  keep_aspect: True\n"
        "optim:\n  lr: 1e-3\n  weight_decay: .5e-4\ntrain:\n  max_steps: +20\n  init_from: null\n"
        "augment:\n  blur: ~\nmodel:\n  channels: [16, 32, 64, 64, 128, 128, 256]\n"
    )
    config = load_config(str(path), [])
    assert config.data.alphabet == "0123456789"  # YAML 1.1: the integer 123456789, refused before
    assert config.data.index_cache == "off"  # YAML 1.1: false
    assert config.optim.lr == 0.001 and config.optim.weight_decay == 0.5e-4  # YAML 1.1: text
    assert config.train.max_steps == 20 and config.train.init_from == "" and config.augment.blur is None
    assert config.data.keep_aspect is True and config.model.settings["channels"][0] == 16
    validate(config)
    config = load_config("crnn.yaml", ["optim.lr=3e-4", "data.index_cache=off", "data.alphabet=0123"])
    assert (config.optim.lr, config.data.index_cache, config.data.alphabet) == (3e-4, "off", "0123")


@pytest.mark.slow
def test_a_second_config_file_is_refused_naming_both():
    one_line_error(
        train("--config", "crnn.yaml", "--config", "mjst.yaml"),
        "error: --config is given twice (crnn.yaml, then mjst.yaml); a second file would replace the first: "
        "give one, and override its keys on the command line",
    )


def test_tilde_is_the_home_folder_in_every_path_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert set(path_keys()) == {
        "data.train",
        "data.val",
        "data.retain",
        "data.index_cache",
        "train.out_dir",
        "train.resume",
        "train.init_from",
    }
    config = load_config(
        "crnn.yaml",
        [
            "data.train=[~/a, b]",
            "data.val=~/v",
            "data.retain=[~/r]",
            "data.index_cache=~/cache",
            "train.out_dir=~/runs/x",
            "train.init_from=~/w.pt",
        ],
    )
    assert config.data.train == [str(tmp_path / "a"), "b"] and config.data.val == [str(tmp_path / "v")]
    assert config.data.retain == [str(tmp_path / "r")]
    assert config.data.index_cache == str(tmp_path / "cache") and config.train.out_dir == str(tmp_path / "runs/x")
    assert config.train.init_from == str(tmp_path / "w.pt")
    assert load_config("crnn.yaml", ["train.resume=~/c.pt"]).train.resume == str(tmp_path / "c.pt")
    words = load_config("crnn.yaml", ["train.resume=none", "data.index_cache=auto"])
    assert (words.train.resume, words.data.index_cache) == ("none", "auto")
    (tmp_path / "chars.txt").write_text("a\nb\n")
    assert load_alphabet("~/chars.txt") == "ab"  # data.alphabet, when it names a file
    assert load_alphabet("~ab") == "~ab"  # characters: `~` is one of them


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.out_dir=", "train.out_dir is empty: give a path"),
        ("data.train=[datasets/a, '']", r"data.train\[1\] is empty: give a path"),
        ("data.index_cache=", "data.index_cache is empty: give a path, or 'auto' or 'off'"),
        ("train.resume=", "train.resume is empty: give a path, or 'auto' or 'none'"),
    ],
)
def test_an_empty_path_is_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("crnn.yaml", [override])


def test_tilde_alone_in_a_file_is_ambiguous(tmp_path):
    path = tmp_path / "home.yaml"
    path.write_text("train:\n  out_dir: ~\n")
    with pytest.raises(ConfigError, match=r"train.out_dir=~ is ambiguous \(null in YAML, the home folder in a shell\)"):
        load_config(str(path), [])


@pytest.mark.slow
def test_a_run_under_tilde_is_written_in_the_home_folder_and_a_failed_start_creates_no_folder(synth, tmp_path):
    """Also: eval_every and save_every beyond max_steps validate and save at the last step, and a warm-up
    longer than the run is said."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {**run_env(), "HOME": str(home)}
    small = [*SMALL_RUN, "train.log_every=1"]
    failed = train(
        "--config", "crnn.yaml", f"data.train=[{synth / 'trian'}]", "train.out_dir=~/runs/x", *small, env=env, cwd=work
    )
    one_line_error(failed, f"LMDB folder {synth / 'trian'} does not exist")
    assert list(home.iterdir()) == [] and list(work.iterdir()) == []  # no runs/, and no ./~ either
    result = train(
        "--config",
        "crnn.yaml",
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        "train.out_dir=~/runs/x",
        "train.max_steps=2",
        "train.eval_every=1000",
        "train.save_every=1000",
        *small,
        env=env,
        cwd=work,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert {path.name for path in (home / "runs" / "x").iterdir()} >= {"best.pt", "last.pt", "config.yaml"}
    assert list(work.iterdir()) == []
    optim = load_config("crnn.yaml", []).optim
    assert (
        f"warning: optim.warmup_steps={optim.warmup_steps} is more than train.max_steps=2: the learning rate "
        f"never reaches optim.lr={optim.lr} (it ends at {2 / optim.warmup_steps:.1%} of it)"
    ) in result.stdout + result.stderr


@pytest.mark.slow
def test_under_torchrun_every_rank_refuses_a_contradiction_before_the_rendezvous_and_creates_no_folder(tmp_path):
    result = run_command(
        *TORCHRUN_TWO_UNTIL_EACH_FAILS,
        "train.py",
        "--config",
        "crnn.yaml",
        "data.alphabet=abcABC",
        "data.train=[a, a/]",
        f"train.out_dir={tmp_path / 'run'}",
        timeout=180,
    )
    assert result.returncode != 0
    # Every rank says it. Counted in the text, not by lines: sys.exit writes a message and its newline in
    # two writes, so two ranks' lines can come out run together on one (it happened once in CI).
    message = "error: data.train lists one LMDB twice: data.train[0]=a and data.train[1]=a/; list it once"
    assert result.stderr.count(message) == 2, result.stderr[-3000:]
    assert not (tmp_path / "run").exists()


# --- keys that contradict each other; Unicode forms ------------------------------------------------


def test_fold_case_with_capital_letters_in_the_alphabet_is_refused_naming_both_keys():
    with pytest.raises(
        ConfigError,
        match=r"data.fold_case=true lowercases every label, but data.alphabet has 3 "
        r"character\(s\) no lowercased label holds \(ABÉ\).*"
        r"Set data.fold_case=false",
    ):
        validate(load_config("crnn.yaml", ["data.alphabet=abcABÉ"]))
    validate(load_config("crnn.yaml", ["data.alphabet=abcABÉ", "data.fold_case=false"]))
    validate(load_config("cjk.yaml", []))  # a mixed-case file with fold_case: false


def jpeg() -> bytes:
    image = Image.new("L", (64, 32), 255)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG")
    return buffer.getvalue()


def test_labels_in_nfd_are_read_against_an_alphabet_in_nfc(tmp_path):
    nfd = ["cafe\u0301", "CAFE\u0301", "nin\u0303o", "plain"]
    assert all(not unicodedata.is_normalized("NFC", label) for label in nfd[:3])
    root = tmp_path / "nfd"
    write_lmdb(root, [(jpeg(), label) for label in nfd])
    transform = build_transform(load_config("crnn.yaml", []))
    codec = CTCCodec(load_alphabet("abcdefijlnopé\u00f1"), fold_case=True)
    dataset = LmdbDataset(root, codec, 26, transform)
    assert dataset.report.dropped["characters outside the alphabet"] == 0
    assert [dataset[i][1] for i in range(len(dataset))] == ["café", "café", "niño", "plain"]
    # An alphabet that lists the accent on its own reads the letter as its parts, whatever the label's form.
    marks = CTCCodec(load_alphabet("acefinop\u0301\u0303"), fold_case=True)
    assert LmdbDataset(root, marks, 26, transform)[0][1] == "cafe\u0301"
    assert marks.normalize("CAF\u00c9") == "cafe\u0301"


def test_an_alphabet_in_nfd_is_read_in_nfc(tmp_path):
    chars = tmp_path / "chars.txt"
    chars.write_text("a\ne\u0301\n\u212b\n")  # é as e + U+0301 on one line; ANGSTROM SIGN
    assert load_alphabet(str(chars)) == "a\u00e9\u00c5"
    assert load_alphabet("a\u212b") == "a\u00c5"


# --- config file forms and command-line slips -----------------------------------------------------


def test_config_file_forms(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n")
    with pytest.raises(ConfigError, match="empty.yaml holds no keys; give the config you meant, or leave out --config"):
        load_config(str(empty), [])
    bom = tmp_path / "bom.yaml"  # Windows Notepad's UTF-8, with CRLF line ends
    bom.write_bytes("\ufefftrain:\r\n  max_steps: 7\r\n".encode("utf-8"))
    assert load_config(str(bom), []).train.max_steps == 7
    tabs = tmp_path / "tabs.yaml"
    tabs.write_text("train:\n\tmax_steps: 7\n")
    with pytest.raises(ConfigError) as raised:
        load_config(str(tabs), [])
    assert str(raised.value) == (
        f"{tabs}:2: not valid YAML: while scanning for the next token; found character "
        f"'\\t' that cannot start any token; indent with spaces: YAML does not allow tabs "
        f"there"
    )


def test_a_config_file_given_without_config_says_to_use_it():
    with pytest.raises(
        ConfigError,
        match=r"override 'crnn.yaml': expected key=value; to read a config file, give " r"--config crnn.yaml",
    ):
        load_config(None, ["crnn.yaml"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--optim.lr=3e-4"],
            "unknown option --optim.lr=3e-4; overrides are written without dashes, as key=value: " "optim.lr=3e-4",
        ),
        (
            ["--train.max_steps", "5"],
            "unknown option --train.max_steps; overrides are written without dashes, as "
            "key=value: train.max_steps=VALUE",
        ),
    ],
)
def test_an_override_written_as_an_option_says_how_to_write_it(monkeypatch, argv, message):
    import train

    monkeypatch.setattr(sys, "argv", ["train.py", "--config", "crnn.yaml", *argv])
    with pytest.raises(ConfigError, match=re.escape(message)):
        train.parse_args()


def test_overrides_may_stand_on_both_sides_of_config(monkeypatch):
    import train

    monkeypatch.setattr(sys, "argv", ["train.py", "train.max_steps=2", "--config", "crnn.yaml", "train.batch_size=8"])
    args = train.parse_args()
    assert args.config == "crnn.yaml" and args.overrides == ["train.max_steps=2", "train.batch_size=8"]


@pytest.mark.parametrize(
    "key, roots", [("data.train", "[datasets/a, ./datasets/a/]"), ("data.val", "[v, w, v]"), ("data.retain", "[r, r/]")]
)
def test_an_lmdb_listed_twice_is_refused(key, roots):
    with pytest.raises(ConfigError, match=rf"{key} lists one LMDB twice: {key}\[0\]="):
        validate(load_config("crnn.yaml", [f"{key}={roots}"]))


def test_a_set_both_validated_and_retained_is_refused():
    with pytest.raises(ConfigError, match="data.retain and data.val both list ./v/: data.val is read at every"):
        validate(load_config("crnn.yaml", ["data.val=[v]", "data.retain=[w, ./v/]"]))


# --- launch: no hang -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stale_world_size_without_torchrun_is_refused_at_once(tmp_path):
    env = {**run_env(), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = train("--config", "crnn.yaml", f"train.out_dir={tmp_path / 'run'}", env=env)
    one_line_error(
        result,
        "error: WORLD_SIZE=2 is set in the environment, but this process was not started by "
        "torchrun ($TORCHELASTIC_RUN_ID is not set)",
        "Unset WORLD_SIZE to run one process, or " "launch with torchrun",
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"RANK": "1"}, "RANK=1 is set in the environment, but this process was not started by torchrun"),
        ({"LOCAL_RANK": "1"}, "LOCAL_RANK=1 is set"),
        ({"WORLD_SIZE": "two"}, "environment variable WORLD_SIZE='two' is not an integer"),
        ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ],
)
def test_a_launch_variable_that_does_not_fit_is_named(monkeypatch, variables, message):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert read_env() == (0, 0, 1, 1)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        read_env()


def test_omp_num_threads_that_is_not_a_number_is_named(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    with pytest.raises(ValueError, match="environment variable OMP_NUM_THREADS='abc' is not an integer"):
        threads_per_process(0, 1)


@pytest.mark.parametrize("rank", [0, 1])
def test_the_rendezvous_gives_up_with_one_line_naming_what_it_waited_for(monkeypatch, rank):
    """Rank 0 hosts the store and waits for the other process; rank 1 finds no store to join."""
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    expected = (
        f"waited 1 s at 127.0.0.1:{port} for the 2 processes of the run (WORLD_SIZE); 1 joined"
        if rank == 0
        else f"waited 1 s for the rendezvous at MASTER_ADDR:MASTER_PORT=127.0.0.1:{port}"
    )
    with pytest.raises(TimeoutError, match=re.escape(expected)):
        join_store(rank, 2, timedelta(seconds=1))


@pytest.mark.slow
def test_sigterm_during_the_rendezvous_stops_at_once(tmp_path):
    """A process of a torchrun world of 2 whose peer never comes: SIGTERM ends the wait, as before training."""
    port = free_port()
    env = {
        **run_env(),
        "TORCHELASTIC_RUN_ID": "test",
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    process = subprocess.Popen(
        [sys.executable, "train.py", "--config", "crnn.yaml", f"train.out_dir={tmp_path / 'run'}"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while process.poll() is None:  # rank 0 hosts the store: listening means it waits for its peer
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert "stopped by SIGTERM before training started; nothing was saved" in stderr
    assert not (tmp_path / "run").exists()
