"""The package is typed: it ships ``py.typed`` and ``mypy`` (strict, pyproject.toml) passes on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[1]


def test_the_package_ships_py_typed_and_is_mypy_strict_clean() -> None:
    assert (CLIENT / "src/sandboxrun/py.typed").is_file()
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(CLIENT / "pyproject.toml"), str(CLIENT / "src/sandboxrun")],
        check=False,
        capture_output=True,
        text=True,
        cwd=CLIENT,
        timeout=300,
    )
    assert done.returncode == 0, f"mypy (requirements-test.txt installs it):\n{done.stdout}{done.stderr}"
