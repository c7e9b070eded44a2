"""The whole tree passes ruff's linter and formatter (configured in pyproject.toml), so CI checks them too."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff() -> list[str]:
    found = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install '.[test]' brings it")
    return [found]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_passes(command):
    out = subprocess.run([*_ruff(), *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
