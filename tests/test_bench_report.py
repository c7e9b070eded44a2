"""The benchmark scripts share one markdown file: each rewrites its own section and keeps the others."""

import os
import subprocess
import sys

import pytest

from experiments import bench_process

pytestmark = pytest.mark.lab  # tests of experiments/, the lab tools


def test_a_report_replaces_its_own_section_and_keeps_the_others(tmp_path, capsys):
    out = tmp_path / "benchmarks.md"
    bench_process.report(["# Anakin throughput", "", "anakin v1"], str(out))
    bench_process.report(["# Sebulba throughput", "", "sebulba v1"], str(out))
    bench_process.report(["# MuZero throughput", "", "muzero v1"], str(out))
    bench_process.report(["# Sebulba throughput", "", "sebulba v2", "## a subsection"], str(out))
    bench_process.report(["# Anakin throughput", "", "anakin v2"], str(out))

    assert out.read_text() == (
        "# Anakin throughput\n\nanakin v2\n\n"
        "# Sebulba throughput\n\nsebulba v2\n## a subsection\n\n"
        "# MuZero throughput\n\nmuzero v1\n"
    )
    assert "anakin v2" in capsys.readouterr().out


def test_an_empty_out_only_prints(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file written anywhere relative would land here
    bench_process.report(["# Anakin throughput", "row"], "")
    assert "row" in capsys.readouterr().out
    assert list(tmp_path.rglob("*")) == []


def test_accelerator_tables_go_beside_the_cpu_ones(tmp_path):
    out = tmp_path / "benchmarks.md"
    bench_process.report([bench_process.heading("Anakin throughput", False), "", "cpu"], str(out))
    bench_process.report([bench_process.heading("Anakin throughput", True), "", "gpu v1"], str(out))
    bench_process.report([bench_process.heading("Anakin throughput", True), "", "gpu v2"], str(out))
    assert out.read_text() == "# Anakin throughput\n\ncpu\n\n# Anakin throughput on an accelerator\n\ngpu v2\n"


def test_accelerator_plans_use_the_hosts_own_devices():
    from experiments import benchmark_muzero, benchmark_sebulba

    plans = [*benchmark_sebulba.accelerator_plan(), *benchmark_muzero.accelerator_plan()]
    specs = [spec for plan in plans for spec in plan]
    assert specs and all(spec["devices"] is None for spec in specs)  # no simulated CPU devices
    assert all(spec.get("learner_devices", "auto") == "auto" for spec in specs)  # device 0 alone is enough
    assert bench_process.worker_env(None).get("XLA_FLAGS") == os.environ.get("XLA_FLAGS")


def test_an_accelerator_measurement_refuses_a_cpu_only_host():
    with pytest.raises(RuntimeError, match="JAX found no GPU or TPU"):
        bench_process.measure(
            "experiments/benchmark_muzero.py", "search", None, env_id="CartPole-v1", batch=2, simulations=2, calls=1
        )


@pytest.mark.parametrize("script", ["benchmark_anakin.py", "benchmark_sebulba.py", "benchmark_muzero.py"])
def test_accelerator_on_a_cpu_only_host_is_a_one_line_error(script):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, os.path.join(bench_process.ROOT, "experiments", script), "--accelerator", "--out", ""],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "JAX sees no GPU or TPU" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "extra, message", [([], "no cleanba/cleanba_ppo.py there"), (["--accelerator"], "run it without --accelerator")]
)
def test_a_bad_cleanba_checkout_is_a_one_line_error_before_any_measurement(tmp_path, extra, message):
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            os.path.join(bench_process.ROOT, "experiments", "benchmark_sebulba.py"),
            "--cleanba",
            str(tmp_path),
            "--out",
            "",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert "BENCH" not in out.stdout


def test_the_actors_row_has_inference_alone_and_the_call_floor():
    from experiments import benchmark_sebulba

    spec = dict(env_id="CartPole-v1", num_envs=8, threads=1, rollouts=2, env_batches=1)
    row = {**spec, **benchmark_sebulba._actors(**spec)}  # as bench_process.measure reports it
    assert row["sps"] > 0 and row["timings"]["inference"] > 0
    assert row["call_floor_us"] > 0 and row["inference_alone_us"] > 0  # timings, so no order between them asserted
    assert row["inference_cpu_us"] > 0
    raw = {"env_id": "CartPole-v1", "num_envs": 8, "batch_size": 8, "threads": 1, "sps": 2 * row["sps"]}
    raw.update(cpu_us_per_step=3.0, cores=2)
    lines = benchmark_sebulba.report_lines(False, [raw], [row], [], [])
    actors_row = next(line for line in lines if line.startswith("| CartPole-v1 | 1 x 8 |"))
    assert f"| {row['inference_alone_us']:,.0f} / {row['call_floor_us']:,.0f} |" in actors_row
    assert "| 50% |" in actors_row
    # 2 cores over (3 us of envpool's + the inference's CPU per step) x raw envpool's rate, at most 100%
    bound = min(1.0, 2e6 / ((3.0 + row["inference_cpu_us"] / 8) * raw["sps"]))
    assert actors_row.endswith(f"| {bound:.0%} |")
    raw_row = next(line for line in lines if line.startswith("| CartPole-v1 | 8 | 8 |"))
    assert raw_row.endswith(f"| 3.0 ({3.0 * raw['sps'] / 1e6:.2f} of 2) |")


def test_sebulba_rows_are_medians_of_alternated_runs(monkeypatch):
    from experiments import benchmark_sebulba

    calls, rates = [], iter([5.0, 50.0, 1.0, 70.0, 3.0, 60.0])

    def fake_measure(kind, **spec):
        calls.append(spec["num_envs"])
        return {"kind": kind, **spec, "sps": next(rates)}

    monkeypatch.setattr(benchmark_sebulba, "measure", fake_measure)
    rows = benchmark_sebulba.measure_medians("raw", [{"num_envs": 8}, {"num_envs": 16}], repeats=3)
    assert calls == [8, 16, 8, 16, 8, 16]  # alternated, not one spec's runs back to back
    assert [r["sps"] for r in rows] == [3.0, 60.0] and rows[0]["runs"] == [5.0, 1.0, 3.0]
    raw = {"env_id": "CartPole-v1", "num_envs": 8, "batch_size": 8, "threads": 1, **rows[0]}
    line = next(line for line in benchmark_sebulba.report_lines(False, [raw], [], [], []) if "| 8 | 8 |" in line)
    assert "| 3 | 5, 1, 3 |" in line


def test_the_anakin_parts_measurement_times_the_rollout_and_the_learner_apart():
    from experiments import benchmark_anakin

    row = benchmark_anakin.measure("parts", 1, 4, benchmark_anakin.SWEEP_STEPS)  # a fresh process, as the script
    assert row["num_envs"] == 4 and row["gradient_steps"] == 16
    assert row["rollout_ms"] > 0 and row["learn_ms"] > 0
    assert row["learn_gflops"] > 0 and row["matmul_gflops"] > 0
    # Every gradient step counted: forward, input and weight gradients of two 3-layer networks are 18 dots on
    # 128 samples of 4 features (64-64 torsos, 2 logits + 1 value): at least the weight gradients' share.
    assert row["learn_mflop"] > row["gradient_steps"] * 2 * 128 * 2 * (4 * 64 + 64 * 64 + 64) / 1e6
    # The trace named the learner's kernels: at least the 6 weight-gradient dots of each gradient step.
    assert row["matmul_kernels"] >= 6 * row["gradient_steps"] and row["other_kernels"] > 0
    assert row["matmul_us"] > 0 and row["other_us"] > 0


def test_hlo_kernels_tells_matrix_multiplications_from_other_kernels():
    import jax
    import jax.numpy as jnp

    from experiments import bench_process

    def step(w, x):
        return jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w) + i, x)

    hlo = jax.jit(step).lower(jnp.ones((8, 8)), jnp.ones((4, 8))).compile().as_text()
    kernels, matmuls = bench_process.hlo_kernels(hlo)
    assert matmuls and matmuls <= kernels
    assert kernels - matmuls  # the tanh, the loop counter
    assert not any(name.startswith(("while", "parameter", "get-tuple-element")) for name in kernels)


def test_the_cleanba_row_has_the_ratio_and_podracers_learner_busy_share():
    from experiments import benchmark_sebulba

    ours = {
        "agent": "ppo",
        "envs_per_thread": 16,
        "rollout_len": 32,
        "sps": 40.0,
        "update_s": 12.8,
        "timings": {"learner_update": 90.0},
        "train_s": 100.0,
        "compile_s": 30.0,
    }
    theirs = {"sps": 32.0, "update_s": 16.0, "startup_s": 70.0}
    raw = {"env_id": "CartPole-v1", "num_envs": 8, "batch_size": 8, "threads": 1, "sps": 1000.0}
    lines = benchmark_sebulba.report_lines(False, [raw], [], [], [(ours, theirs)])
    assert "| ppo | 16 x 32 | 40.0 | 32.0 | 1.25x | 12.8 / 16.0 | 90% | 30.0 | 70.0 |" in lines


@pytest.mark.parametrize(
    "script",
    [
        "benchmark_anakin.py",
        "benchmark_brax.py",
        "benchmark_muzero.py",
        "benchmark_recurrent.py",
        "benchmark_sebulba.py",
        "multiprocess.py",
        "peer_purejaxrl.py",
        "results.py",
        "stop_latency.py",
    ],
)
def test_each_lab_script_runs_as_a_file_from_a_checkout(script):
    """As docs/development.md runs them (`python experiments/NAME.py`): experiments/ is not installed, so each
    must find its siblings itself (results.py once could not)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, os.path.join("experiments", script), "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0 and "usage" in out.stdout, out.stderr[-2000:]


def test_the_device_summary_is_one_table_of_the_headline_measurements():
    from experiments import device_summary

    log = "\n".join(
        [
            "device_check: benchmark_anakin --accelerator",
            'BENCH {"mode": "train", "num_envs": 1024, "sps": 1.0, "compile_s": 1.0, "backend": "gpu"}',
            'BENCH {"mode": "train", "num_envs": 4096, "sps": 2500000.4, "compile_s": 3.21, "backend": "gpu"}',
            'BENCH {"kind": "train", "env_id": "Breakout-v5", "agent": "ppo", "sps": 9.0, "fps": 36.0}',
            'BENCH {"kind": "train", "env_id": "Breakout-v5", "agent": "impala", "envs_per_thread": 32, '
            '"actor_threads": 2, "learner_devices": "auto", "sps": 5000.0, "fps": 20000.0, "compile_s": 9.0}',
        ]
    )
    table = device_summary.summary(device_summary.bench_lines(log))
    assert table[0].startswith("| measurement (backend gpu) |")
    assert "| Anakin CartPole, 4,096 envs, training (PPO) | 2,500,000 | 2,500,000 | 3.2 | |" in table
    assert "| Anakin CartPole, 4,096 envs, environment only (random policy) | - | - | - | |" in table  # not in the log
    (impala,) = [row for row in table if "IMPALA" in row]
    assert "| 5,000 | 20,000 | 9.0 |" in impala and "24,000 frames/s on one A100" in impala
    assert len(table) == 5


def test_the_cpu_bound_adds_the_inference_to_envpools_cpu_per_step():
    from experiments import benchmark_sebulba

    raw = {"env_id": "Breakout-v5", "num_envs": 32, "batch_size": 32, "threads": 2, "sps": 4000.0}
    raw.update(cpu_us_per_step=500.0, cores=2)
    actors = {"num_envs": 16, "inference_cpu_us": 3200.0}  # 2 batches x 16: 200 us of inference CPU per step
    assert benchmark_sebulba._cpu_bound(actors, raw) == "71%"  # 2 cores / (700 us x 4,000 steps/s)
    assert benchmark_sebulba._cpu_bound({"num_envs": 16}, raw) == "-"  # not measured (an accelerator's run)
    assert benchmark_sebulba._cpu_bound({**actors, "inference_cpu_us": 0.0}, {**raw, "cpu_us_per_step": 1.0}) == "100%"
    row = {**actors, "env_id": "Breakout-v5", "env_batches": 2, "sps": 2000.0, "seconds": 1.0, "timings": {}}
    lines = benchmark_sebulba.report_lines(False, [raw], [row], [], [])
    actors_row = next(line for line in lines if line.startswith("| Breakout-v5 | 2 x 16 |"))
    assert "| 50% |" in actors_row and actors_row.endswith("| 71% |")  # beside the raw row of 2 x 16 = 32 envs
