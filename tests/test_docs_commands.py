"""Every command of the README and docs/ works as written.

Three checks, against the installed package (a fresh virtual environment per install line would
cost minutes; CI's environment is itself fresh, made by scripts/setup-venv.sh):

- installs: a command that runs one of our scripts needs nothing that the `pip install` line before
  it in the same page does not bring (the extras' requirements, followed through the installed
  packages' metadata). This is what catches "pip install . then ModuleNotFoundError".
- runs: the README's commands and the quick ones of docs/running.md and docs/install.md run exactly
  as written, in a shell whose `python` and `horovodrun` are this environment's; the commands of one code block
  run in one test, in order, as a reader pastes them (a `cat` of what the command before it
  wrote), and a page's `/tmp/` paths are moved into that test's own temporary directory, so no
  run reads another's files.
- coverage: every example a page names and that is not run here is run (shortened) by some test.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import site
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Commands that name things of the reader's own: hosts, a hostfile, a config file. (A script that
# is not in the repository, `python train.py`, is one too: see _placeholder.)
PLACEHOLDERS = re.compile(r"\bserver\d\b|--hostfile|--config-file horovod\.yaml")
# Run exactly as written: the README's commands, and docs/running.md's and docs/install.md's plain
# horovodrun ones (running.md's mpirun, srun and --mpi commands need an MPI or a Slurm cluster:
# tests/mpi and tests/slurm).
RUN_PAGES = {"README.md", "running.md", "install.md"}
RUN_FIRST_WORDS = {"bash", "horovodrun", "cat"}
NOT_RUN = {
    "bash scripts/test.sh": "it is CI's own command: this suite is what it runs",
    "bash scripts/docs.sh": "it builds the site: tests/test_docs_site.py builds it, in strict mode",
    "pip install": "installs: checked by test_each_command_needs_only_what_its_page_installs",
}


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str
    block: int  # the line its code block starts on

    def __str__(self) -> str:
        return f"{self.page.name}:{self.line}: {self.text}"


def page_commands(page: Path) -> list[Command]:
    """The shell commands of a page's bash/console blocks, continuation lines joined; in a console
    block only the `$ ` lines are commands (the rest is their output)."""
    text = page.read_text()
    found = []
    for block in re.finditer(r"^```(bash|sh|console)\n(.*?)^```", text, re.S | re.M):
        first = text[:block.start(2)].count("\n") + 1
        pending, start = "", 0
        for offset, line in enumerate(block.group(2).splitlines()):
            if block.group(1) == "console" and not pending:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not pending:
                start = first + offset
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            command = _strip_comment(pending + line)
            if command:
                found.append(Command(page, start, command, first))
            pending = ""
    return found


def _strip_comment(text: str) -> str:
    """The command without its trailing `# ...` comment, quoting kept as written."""
    quote = None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip()
    return text.strip()


ALL = [command for page in PAGES for command in page_commands(page)]


def _script(command: Command) -> Path | None:
    """Our script that the command runs (`python examples/...py`, `python -m horovod.x`), if any."""
    words = shlex.split(command.text)
    for i, word in enumerate(words):
        # Only with this environment's python (a page may run one of its own, `$MX script.py`).
        if word.endswith(".py") and (REPO / word).is_file() and i > 0 and words[i - 1] == "python":
            return REPO / word
        if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("horovod."):
            package = REPO / words[i + 1].replace(".", "/")
            return package / "__main__.py" if package.is_dir() else package.with_suffix(".py")
    return None


# -- installs ---------------------------------------------------------------------------------
@functools.cache
def _installed_by(extras: frozenset[str]) -> set[str]:
    """Every distribution `pip install ".[extras]"` brings: khorovod's requirements from
    pyproject.toml, then theirs from the installed metadata (markers evaluated, no extras)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        todo += [Requirement(r) for r in project["optional-dependencies"][extra]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            requires = []  # not installed here: trust the name alone
        todo += [Requirement(r) for r in requires]
        todo += [Requirement(r) for extra in req.extras for r in requires if f'extra == "{extra}"' in r]
    return seen


@functools.cache
def _providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _imports(path: Path) -> set[str]:
    """The top-level modules a file imports, anywhere in it."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def _needs(command: Command) -> set[str] | None:
    """The distributions a command needs (None: it runs nothing of ours): what its script imports
    (a package run with -m: all of it), the Keras backend it asks for; pytest needs the [test] extra."""
    words = shlex.split(command.text)
    if words[:3] == ["python", "-m", "pytest"]:
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        return {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["test"]}
    script = _script(command)
    if script is None:
        return None
    files = list(script.parent.glob("*.py")) if script.name == "__main__.py" else [script]
    modules = set().union(*(_imports(path) for path in files))
    modules |= {word.split("=", 1)[1] for word in words if word.startswith("KERAS_BACKEND=")}
    modules -= set(sys.stdlib_module_names) | {"horovod", "__future__"} | {p.stem for p in script.parent.glob("*.py")}
    providers = _providers()
    return {canonicalize_name(providers.get(module, [module])[0]) for module in modules}


def _install_lines() -> list[tuple[Command | None, Command]]:
    """Each page's commands that run something of ours, with the install line before them."""
    pairs = []
    for page in PAGES:
        install = None
        for command in page_commands(page):
            if command.text.startswith("pip install"):
                install = command
            elif _needs(command) is not None:
                pairs.append((install, command))
    return pairs


@pytest.mark.parametrize("install, command", _install_lines(), ids=lambda c: str(c)[:90] if c else "none")
def test_each_command_needs_only_what_its_page_installs(install, command):
    assert install is not None, f"{command}: no `pip install` line before it on its page"
    match = re.fullmatch(r'pip install "?\.(?:\[([\w,]+)\])?"?', install.text)
    assert match, f"{install}: not of the form pip install \".[extras]\""
    extras = frozenset(filter(None, (match.group(1) or "").split(",")))
    missing = _needs(command) - _installed_by(extras)
    assert not missing, f"{command}\nneeds {sorted(missing)}, which {install.text!r} does not install"


# -- runs ---------------------------------------------------------------------------------------
def _shell_env(scratch: Path) -> dict[str, str]:
    """A shell whose `python` and `horovodrun` are this environment's, as an activated venv has
    them (horovodrun the installed console script; a stand-in where khorovod is not installed)."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir(exist_ok=True)
    installed = Path(sys.executable).parent / "horovodrun"
    # Wrappers, not symlinks: a venv's python finds its environment next to its own path.
    for name, target in [("python", f'"{sys.executable}"'),
                         ("horovodrun", f'"{installed}"' if installed.is_file()
                          else f'"{sys.executable}" -m horovod.runner.launch')]:
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("_HOROVOD_SECRET_KEY", None)
    return env


def _made_by_setup_venv_for_this_checkout(*extras: str) -> bool:
    """Whether scripts/setup-venv.sh installed these extras into this environment, editable from
    this checkout, with this pyproject.toml: then a script that calls it installs nothing."""
    stamp = Path(sys.prefix) / ".khorovod-extras"
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    # The installed one, not the khorovod.egg-info an editable build leaves in the checkout.
    found = list(importlib.metadata.distributions(name="khorovod", path=site.getsitepackages()))
    origin = json.loads(found[0].read_text("direct_url.json") or "{}") if found else {}
    return (stamp.is_file() and {f"{digest} {extra}" for extra in extras} <= set(stamp.read_text().splitlines())
            and origin.get("url") == REPO.as_uri())


def _placeholder(command: Command) -> bool:
    """Whether the command names something of the reader's: hosts, files, or a script not here."""
    return bool(PLACEHOLDERS.search(command.text)) or any(
        word.endswith(".py") and not (REPO / word).is_file() for word in shlex.split(command.text))


RUNNABLE = [c for c in ALL if c.page.name in RUN_PAGES and not _placeholder(c)
            and (c.page.name == "README.md" or (c.text.split()[0] in RUN_FIRST_WORDS and "--mpi" not in c.text))
            and not any(c.text.startswith(prefix) for prefix in NOT_RUN)]


def _blocks(commands: list[Command]) -> list[list[Command]]:
    """The commands grouped by the code block they come from, in page order."""
    blocks: dict[tuple[Path, int], list[Command]] = {}
    for command in commands:
        blocks.setdefault((command.page, command.block), []).append(command)
    return list(blocks.values())


RUNNABLE_BLOCKS = _blocks(RUNNABLE)


def _private_tmp(text: str, scratch: Path) -> str:
    """`text` with the page's `/tmp/` paths moved under `scratch`."""
    return re.sub(r"(?<![\w./])/tmp/", f"{scratch}/", text)


def test_some_commands_run_and_every_other_is_accounted_for():
    assert len(RUNNABLE) >= 6, [str(c) for c in RUNNABLE]


def test_a_later_command_of_a_block_can_read_what_an_earlier_one_wrote():
    (block,) = [b for b in RUNNABLE_BLOCKS if any(c.text.startswith("cat /tmp/logs/") for c in b)]
    assert [c.text.split()[0] for c in block] == ["horovodrun", "cat"]
    assert _private_tmp(block[1].text, Path("/x")) == "cat /x/logs/rank.1/stdout"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=lambda b: f"{b[0].page.name}:{b[0].line}")
def test_commands_run_as_written(block, tmp_path):
    env = _shell_env(tmp_path)
    for command in block:
        if command.text.startswith("bash scripts/demo.sh"):
            if not _made_by_setup_venv_for_this_checkout("torch", "examples"):
                pytest.skip("this environment was not made from this checkout by scripts/setup-venv.sh, so the "
                            "demo would install into it or build a new one (CI's is: there the demo runs)")
            env["VENV"] = sys.prefix  # the demo then finds everything installed: nothing to install
        proc = subprocess.run(["bash", "-c", _private_tmp(command.text, tmp_path)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=280)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if command.text.startswith("bash scripts/demo.sh"):
            assert "setup-venv:" not in proc.stderr  # a re-run installs nothing, and says nothing
        if "examples/" in command.text or "demo.sh" in command.text:
            assert re.search(r"final test accuracy:? (0\.9|9\d)", proc.stdout), proc.stdout[-2000:]
        if command.text.startswith("cat "):
            assert proc.stdout.strip(), f"{command}: printed nothing"


@pytest.mark.timeout(120)
def test_readme_python_snippet_runs_on_two_ranks(tmp_path):
    (snippet,) = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
    script = tmp_path / "snippet.py"
    script.write_text(snippet + "print('rank', hvd.rank(), 'ready with', hvd.size())\n")
    proc = subprocess.run(["bash", "-c", f"horovodrun -np 2 python {script}"], cwd=REPO, env=_shell_env(tmp_path),
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[1]<stdout>:rank 1 ready with 2" in proc.stdout


# -- coverage -------------------------------------------------------------------------------------
def test_every_example_the_docs_name_is_run_by_some_test():
    tests = "\n".join(path.read_text() for path in (REPO / "tests").rglob("*.py") if path.name != Path(__file__).name)
    run_here = {_script(c) for c in RUNNABLE}
    unrun = sorted({str(_script(c).relative_to(REPO)) for c in ALL if _script(c) and _script(c) not in run_here
                    and _script(c).is_relative_to(REPO / "examples") and _script(c).name not in tests})
    assert not unrun, f"examples the docs tell users to run that no test runs: {unrun}"
