"""The notebooks in notebooks/ run top to bottom (their own asserts check what they show)."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(f for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb")))
def test_notebook_runs(name, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # a notebook sees the machine as a user would, not 8 devices
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}).execute()
    errors = [out for cell in notebook.cells for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors
