"""The repository's promises to a newcomer: CI runs exactly the README's test command."""
from __future__ import annotations

from tests.conftest import REPO


def readme_commands() -> list[str]:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.startswith("python3 -m venv .venv")]


def test_ci_runs_the_readme_test_command():
    commands = readme_commands()
    assert len(commands) == 2, "README opens with two commands: train, and test"
    test_command = next(command for command in commands if "pytest" in command)
    assert test_command in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_train_command_uses_the_default_config_and_eval_sh():
    train_command = next(command for command in readme_commands() if "train.py" in command)
    assert "--config crnn.yaml" in train_command and "scripts/eval.sh" in train_command
    assert (REPO / "configs" / "crnn.yaml").is_file()
