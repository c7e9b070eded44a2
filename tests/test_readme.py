"""The README's commands and Python example, as a new user copies them."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_the_two_commands_are_the_install_and_run_and_the_ci_test_command():
    first, tests = _blocks("bash")[:2]
    assert first.strip() == "pip install . && podracer anakin"
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert tests.strip() in ci  # CI runs exactly the README's test command


@pytest.mark.slow
def test_the_python_example_runs_and_learns(tmp_path):
    (example,) = _blocks("python")
    probe = example + "\nassert result.records[-1]['episode_return'] > 0.8, result.records[-1]\n"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as on a user's laptop
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
