"""Every code example in README.md and docs/ runs as printed: TOML blocks
are config files the run accepts, ``python -m awa_trio`` lines parse (and
the run's print its settings), Python blocks run against a real database
(``# path.py`` blocks are the modules other examples import)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from awa_trio.cli import resolve, split_command

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_URL = "postgresql://localhost/awa"
MODULE_HEADER = re.compile(r"^# ([\w/]+\.py)\n")


def blocks(language: str) -> list[tuple[str, str]]:
    """(where, text) of every fenced block of that language."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.M | re.S):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def commands() -> list[tuple[str, list[str]]]:
    """Each ``python -m awa_trio ...`` of the shell blocks, as its argv."""
    found = []
    for where, text in blocks("sh"):
        for line in text.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words[:3] == ["python", "-m", "awa_trio"]:
                    found.append((where, words[3:]))
    return found


def write_modules(directory: Path) -> list[str]:
    """The ``# path.py`` blocks, written where they say; their module names."""
    names = []
    for _, text in blocks("python"):
        header = MODULE_HEADER.match(text)
        if header:
            path = directory / header.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            names.append(header.group(1).removesuffix(".py").replace("/", "."))
    return names


def test_the_pages_have_examples_of_each_kind():
    assert len(blocks("toml")) >= 3 and len(blocks("python")) >= 4 and len(commands()) >= 8


@pytest.mark.parametrize(("where", "text"), blocks("toml"), ids=[w for w, _ in blocks("toml")])
async def test_every_toml_example_is_a_config_file_the_run_accepts(where, text, tmp_path):
    config = tmp_path / "awa_trio.toml"
    config.write_text(text)
    result = await trio.run_process([sys.executable, "-m", "awa_trio", "--config", str(config), "--print-config"],
                                    capture_stdout=True, capture_stderr=True, check=False)
    assert result.returncode == 0, f"{where}: {result.stderr.decode()}"


@pytest.mark.parametrize(("where", "argv"), commands(), ids=[w for w, _ in commands()])
async def test_every_command_example_parses_and_the_runs_print_their_settings(where, argv, tmp_path):
    write_modules(tmp_path)
    command, _ = split_command(argv)
    if command in (None, "run") and "--help" not in argv:
        result = await trio.run_process([sys.executable, "-m", "awa_trio", *argv, "--print-config"],
                                        capture_stdout=True, capture_stderr=True, check=False, cwd=tmp_path)
        assert result.returncode == 0, f"{where}: {result.stderr.decode()}"
    else:
        assert resolve(argv, environ={}).command == command, where


def python_examples() -> list[tuple[str, str]]:
    return [(where, text) for where, text in blocks("python") if not MODULE_HEADER.match(text)]


@pytest.mark.parametrize(("where", "text"), python_examples(), ids=[w for w, _ in python_examples()])
async def test_every_python_example_runs(where, text, database_url, tmp_path):
    if where.startswith("README.md"):
        pytest.skip("README's example has its own tests (test_readme_examples.py)")
    write_modules(tmp_path)
    script = tmp_path / "example.py"
    script.write_text(text.replace(EXAMPLE_URL, database_url))
    result = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path))
    assert result.returncode == 0, f"{where}:\n{result.stderr[-3000:]}"


async def test_every_module_example_imports(tmp_path):
    names = write_modules(tmp_path)
    assert names, "no module examples"
    for name in names:
        result = await trio.to_thread.run_sync(lambda name=name: subprocess.run(
            [sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=60, cwd=tmp_path))
        assert result.returncode == 0, f"{name}:\n{result.stderr[-3000:]}"


def documented_defaults() -> list[tuple[str, str, str]]:
    """(page, field, value) for each "`field` (value" in the pages, where
    field is a setting: how the docs state a default."""
    import dataclasses

    from awa_trio.config import MaintenanceConfig

    fields = {field.name for field in dataclasses.fields(MaintenanceConfig)}
    found = []
    for page in PAGES:
        for name, value in re.findall(r"`(\w+)` \((\d[\d.]* ?(?:ms|s|m|h|d)?)[;,):]", page.read_text()):
            if name in fields:
                found.append((page.name, name, value.replace(" ", "")))
    return found


def test_every_default_the_docs_state_is_the_default():
    import dataclasses

    from awa_trio.config import MaintenanceConfig, parse_duration

    defaults = {field.name: field.default for field in dataclasses.fields(MaintenanceConfig)}
    stated = documented_defaults()
    assert len(stated) >= 5, stated
    wrong = []
    for page, name, value in stated:
        actual = defaults[name]
        said = int(value) if isinstance(actual, int) else parse_duration(value, field=name)
        if said != actual:
            wrong.append((page, name, value, actual))
    assert wrong == []
