"""The repository's promises to a newcomer: CI runs exactly the README's test command, and installs the
versions the suite is tested on while `pip install -e .` keeps a supported torch already installed."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO


def readme_blocks() -> list[str]:
    """README's shell blocks that set up from scratch (they start with `python3 -m venv .venv`), one step a line."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"), re.M | re.S)
    return [block for block in blocks if block.startswith("python3 -m venv .venv")]


def readme_commands() -> list[str]:
    """Each of those blocks as one command line, its steps joined by `&&`."""
    return [" && ".join(block.splitlines()) for block in readme_blocks()]


def test_ci_runs_the_readme_test_command():
    blocks = readme_blocks()
    assert len(blocks) == 2, "README opens with two commands: train, and test"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.index(blocks[1]) < readme.index("\n## "), "both come before the first section"
    test_block = next(block for block in blocks if "pytest" in block)
    assert test_block in (REPO / ".ci" / "run").read_text(encoding="utf-8"), ".ci/run runs the README's block verbatim"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci and ci.index("set -euo pipefail") < ci.index(test_block)
    # Under `set -e` a step that fails before a line's last `&&` does not stop the script: one step a line.
    assert [line for line in test_block.splitlines() if "&&" in line] == []


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


def project_files(*patterns: str) -> list:
    """The repository's own files matching `patterns`, without what a run, a venv or a tool leaves."""
    skipped = {".venv", ".git", ".gpu_check", "runs", "datasets", "build", "node_modules"}
    return [
        path
        for pattern in patterns
        for path in sorted(REPO.rglob(pattern))
        if not skipped & set(path.relative_to(REPO).parts) and ".egg-info" not in str(path)
    ]


def test_configs_and_code_point_only_at_docs_that_exist():
    """A pointer into docs/ (a page, and maybe its #heading) in a config or a code comment names what exists: a doc
    removed or a section renamed leaves no pointer dangling in the template a fork inherits."""
    broken = []
    for path in project_files("*.py", "*.yaml", "*.sh", "*.toml", "run"):
        if path.is_dir():
            continue
        for page, anchor in re.findall(r"docs/([\w.-]+\.md)(?:#([\w-]+))?", path.read_text(encoding="utf-8")):
            target = REPO / "docs" / page
            if not target.is_file():
                broken.append(f"{path.relative_to(REPO)}: docs/{page} (no such file)")
            elif anchor and anchor not in heading_anchors(target.read_text(encoding="utf-8")):
                broken.append(f"{path.relative_to(REPO)}: docs/{page}#{anchor} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("package", ["models", "data", "training", "evaluation", "synthetic", "interop", "utils"])
def test_each_package_says_what_every_module_of_it_holds(package):
    """A package's docstring is where a reader learns which module holds what: a module added or renamed
    without a word there is one the reader cannot find."""
    docstring = (REPO / package / "__init__.py").read_text(encoding="utf-8").split('"""')[1]
    modules = sorted(path.name for path in (REPO / package).glob("*.py") if path.name != "__init__.py")
    assert [name for name in modules if name not in docstring] == []


COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
P_VALUE = re.compile(r"\bp(?:\s*[<=>]\s*| )0?\.\d")


def test_readme_and_configs_hold_no_commit_hash_nor_p_value():
    """What a fork inherits describes the project as it is: the history of how a recipe was chosen lives in
    git's, not in the landing page or the recipes."""
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in [REPO / "README.md", *project_files("configs/*.yaml")]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if COMMIT_HASH.search(line) or P_VALUE.search(line)
    ]
    assert not found, "\n".join(found)


def constraints() -> dict[str, Version]:
    """constraints.txt's pins, by normalized package name."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (specifier,) = requirement.specifier  # one `==` a line
            assert specifier.operator == "==", f"constraints.txt: {line} is not an exact version"
            pins[canonicalize_name(requirement.name)] = Version(specifier.version)
    return pins


def pyproject_requirements() -> dict[str, Requirement]:
    """pyproject.toml's dependencies and its extras', by normalized package name (the extras that name the
    project itself left out)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [*project["dependencies"], *(line for extra in project["optional-dependencies"].values() for line in extra)]
    requirements = {canonicalize_name(Requirement(line).name): Requirement(line) for line in lines}
    requirements.pop(canonicalize_name(project["name"]))
    return requirements


def test_pyproject_declares_ranges_that_keep_a_supported_torch():
    """`pip install -e .` into an environment that holds torch 2.11 to 2.14 (a CUDA build, say) keeps it:
    pyproject.toml declares ranges, and the exact versions live in constraints.txt."""
    requirements = pyproject_requirements()
    for version in ("2.11.0", "2.11.0+cu130", "2.13.0+cpu", "2.14.1"):
        assert requirements["torch"].specifier.contains(version), f"torch {version} is supported"
    for version in ("2.10.0", "2.15.0"):
        assert not requirements["torch"].specifier.contains(version), f"torch {version} is not supported"
    for version in ("0.26.0", "0.29.1"):
        assert requirements["torchvision"].specifier.contains(version), f"torchvision {version} goes with it"
    pinned = [str(requirement) for requirement in requirements.values() if "==" in str(requirement.specifier)]
    assert not pinned, f"pyproject.toml pins {pinned}: exact versions belong in constraints.txt"


def test_constraints_pin_every_dependency_within_its_range():
    """One exact version for each package pyproject.toml names, and one pip can install: inside the range."""
    requirements, pins = pyproject_requirements(), constraints()
    assert sorted(pins) == sorted(requirements), "constraints.txt pins exactly pyproject.toml's dependencies"
    outside = [
        f"{name}=={pins[name]} ({requirements[name].specifier})"
        for name in pins
        if pins[name] not in requirements[name].specifier
    ]
    assert not outside, f"constraints.txt pins versions pyproject.toml's ranges refuse: {outside}"


def test_constraints_pin_the_versions_the_suite_runs_on():
    """The tested versions are the ones this suite runs on (torch 2.14.1+cu130 counts as 2.14.1). In another
    environment this names what differs: `pip install -r requirements-dev.txt` installs the tested versions;
    after an upgrade, change constraints.txt (CONTRIBUTING.md)."""
    differences = []
    for name, pinned in constraints().items():
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            differences.append(f"{name}: not installed, constraints.txt pins {pinned}")
            continue
        if Version(installed.public) != pinned:
            differences.append(f"{name}: {installed} installed, constraints.txt pins {pinned}")
    assert not differences, "\n".join(differences)


def test_every_requirements_file_installs_the_tested_versions():
    """The README's commands and CI install through requirements*.txt: each applies constraints.txt first."""
    files = sorted(REPO.glob("requirements*.txt"))
    assert len(files) >= 5
    for path in files:
        first_line = path.read_text(encoding="utf-8").splitlines()[0]
        assert first_line == "-c constraints.txt", f"{path.name} starts with {first_line!r}"
