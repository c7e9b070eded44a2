"""The Cleanba harness: its patches apply (or fail loudly) and its runs are timed from the learner's updates."""

import os
import sys

import pytest

from experiments import peer_cleanba

pytestmark = pytest.mark.lab  # tests of experiments/, the lab tools


def _fake_checkout(root, drop: str | None = None):
    """A checkout whose scripts hold exactly the text every patch expects (minus the patch ``drop``)."""
    (root / "cleanba").mkdir(parents=True)
    for script in peer_cleanba.SCRIPTS:
        text = "".join(
            f"{patch.old}\n" for patch in peer_cleanba.PATCHES if script in patch.scripts and patch.why != drop
        )
        (root / "cleanba" / script).write_text(text)


def test_every_patch_applies_once_to_the_copy_outside_the_checkout(tmp_path):
    _fake_checkout(tmp_path / "cleanba-checkout")
    paths = peer_cleanba.prepare(str(tmp_path / "cleanba-checkout"), str(tmp_path / "work"))
    assert set(paths) == set(peer_cleanba.SCRIPTS)
    for script, path in paths.items():
        text = open(path).read()
        assert os.path.dirname(path) == str(tmp_path / "work")
        for patch in peer_cleanba.PATCHES:
            if script in patch.scripts:
                assert patch.new in text, (script, patch.why)
        assert "jax.tree_map(" not in text and "jax.device_put_sharded(" not in text
    untouched = open(tmp_path / "cleanba-checkout" / "cleanba" / "cleanba_ppo.py").read()
    assert "jax.tree_map(" in untouched  # the checkout itself is not changed


def test_a_patch_that_finds_nothing_names_itself(tmp_path):
    why = peer_cleanba.PATCHES[0].why
    _fake_checkout(tmp_path / "c", drop=why)
    with pytest.raises(ValueError, match="expects 1 occurrence"):
        peer_cleanba.prepare(str(tmp_path / "c"), str(tmp_path / "work"))
    with pytest.raises(FileNotFoundError, match="no cleanba/cleanba_ppo.py there"):
        peer_cleanba.prepare(str(tmp_path / "nothing"), str(tmp_path / "work"))


FAKE_LEARNER = f'''
import sys, time
for update in range(1, 100):
    time.sleep(0.2)
    print("{peer_cleanba.UPDATE_LINE}", update, time.time(), flush=True)
'''


def test_a_run_is_timed_from_its_updates_and_stopped(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE_LEARNER)
    result = peer_cleanba.run(str(script), [], devices=2, updates=6)
    assert result["updates"] == 4
    assert 0.18 < result["update_s"] < 0.4
    assert result["startup_s"] >= 0.2


def test_a_run_that_ends_early_shows_its_output(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise ImportError('no envpool here')\n")
    with pytest.raises(RuntimeError, match="^stopped after 0 of 4 updates: ImportError: no envpool here\n"):
        peer_cleanba.run(str(script), [], devices=2, updates=4, python=sys.executable)
