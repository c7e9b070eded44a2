"""The stop-latency lab script: a SIGTERM during start-up ends the run with 143, timed from the signal."""

import pytest

from experiments import stop_latency

pytestmark = pytest.mark.lab  # tests of experiments/, the lab tools


@pytest.mark.slow
def test_a_sigterm_while_starting_is_timed_to_the_exit(tmp_path):
    code, seconds, last = stop_latency.stop_seconds(
        0.5, ["anakin", "--preset", "catch_ppo", "--total-env-steps", "100000000"], str(tmp_path / "run")
    )
    assert code == 143, last
    assert 0 < seconds < 120 and (tmp_path / "run" / "checkpoints").is_dir()
