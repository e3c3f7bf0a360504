"""The repository's promises to a newcomer: CI runs exactly the README's test command."""

from __future__ import annotations

import re

import pytest

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


@pytest.mark.slow
def test_readme_train_command_writes_the_held_out_test_split_and_evaluates_on_it(tiny_run, tmp_path):
    """The README's generator and eval.sh steps, run as written (the generator with fewer samples, eval.sh
    on a small checkpoint placed where the training step would leave best.pt)."""
    import shutil
    import subprocess
    import sys

    from scripts.make_synthetic import parse_args
    from tests.conftest import run_env

    train_command = next(command for command in readme_commands() if "train.py" in command)
    steps = dict(
        (step.split()[1] if step.startswith("python ") else step.split()[0], step)
        for step in train_command.split(" && ")
    )
    generator, evaluation = steps["scripts/make_synthetic.py"], steps["scripts/eval.sh"]
    assert parse_args(generator.split()[2:]).test > 0  # the default writes a test split
    env = {**run_env(), "PYTHON": sys.executable, "PATH": f"{REPO / '.venv' / 'bin'}:{run_env()['PATH']}"}
    for script in ("make_synthetic.py", "eval.sh", "eval.py"):
        (tmp_path / "scripts").mkdir(exist_ok=True)
        (tmp_path / "scripts" / script).symlink_to(REPO / "scripts" / script)
    generated = subprocess.run(
        generator.replace("python ", f"{sys.executable} ", 1).split()
        + ["--train", "8", "--val", "8", "--test", "8", "--workers", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert generated.returncode == 0, generated.stderr
    assert (tmp_path / "datasets" / "synth" / "test" / "data.mdb").is_file()
    (tmp_path / "runs" / "crnn").mkdir(parents=True)
    shutil.copy(tiny_run / "best.pt", tmp_path / "runs" / "crnn" / "best.pt")
    evaluated = subprocess.run(evaluation.split(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    rows = [line.split()[0] for line in evaluated.stdout.splitlines() if line.strip()]
    assert "val" in rows and "test" in rows


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation but `-` and `_` dropped, spaces
    as hyphens, a repeated heading numbered from -1 on."""
    anchors: set[str] = set()
    in_code = False
    for line in markdown.splitlines():
        in_code ^= line.startswith("```")
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        anchor, count = slug, 0
        while anchor in anchors:
            count += 1
            anchor = f"{slug}-{count}"
        anchors.add(anchor)
    return anchors


def test_every_link_between_the_docs_reaches_its_file_and_heading():
    """A relative link in README.md, CONTRIBUTING.md or docs/ names a file that exists and, after `#`, one of
    its headings: a section renamed or moved breaks the links to it, and this says which."""
    broken = []
    for page in [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
