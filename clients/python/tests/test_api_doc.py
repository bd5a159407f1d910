"""docs/python-api.md is the package's API as the code says it: hack/python-api-doc.py --check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_api_reference_is_generated_from_the_code() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "hack/python-api-doc.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
