"""The host-side parts on their own: the parameter store, the thread group, the run log's resume, minibatches
and their shuffles."""

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer.agents.sgd import PACKED_PERMUTATION_MAX, random_permutation, resolve_unroll, shuffled_minibatches
from podracer.runlog import METRICS_FILE, RunLog, read_records
from podracer.sebulba import lifecycle
from podracer.sebulba.lifecycle import ThreadGroup, WorkerFailed
from podracer.sebulba.params import KEEP_VERSIONS, ParamsStore
from podracer.signals import StopRequested


def _in_thread(fn):
    """Starts ``fn`` in a thread; returns the thread and a dict that receives its result or exception."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            out["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def test_params_store_copies_each_version_to_every_actor_device():
    devices = jax.devices()[:2]
    store = ParamsStore(devices, threading.Event())
    params = {"w": jax.device_put(jnp.arange(3.0), devices[0])}
    store.publish(0, params)
    for device in devices:
        version, copy = store.newest(device)
        assert version == 0 and copy["w"].devices() == {device}
        np.testing.assert_array_equal(copy["w"], [0.0, 1.0, 2.0])
    # a copy, never the learner's own buffer (the learner donates its state)
    assert store.newest(devices[0])[1]["w"].unsafe_buffer_pointer() != params["w"].unsafe_buffer_pointer()


def test_params_store_waits_for_a_version_and_drops_old_ones():
    device = jax.devices()[0]
    store = ParamsStore([device], threading.Event())
    thread, out = _in_thread(lambda: store.exactly(2, device))
    for version in range(3):
        time.sleep(0.05)
        assert "value" not in out  # still waiting for version 2
        store.publish(version, jnp.float32(version))
    thread.join(timeout=5)
    assert float(out["value"]) == 2.0
    for version in range(3, 3 + KEEP_VERSIONS):
        store.publish(version, jnp.float32(version))
    with pytest.raises(RuntimeError, match="parameter version 2 was dropped"):
        store.exactly(2, device)
    assert float(store.exactly(2 + KEEP_VERSIONS, device)) == 2.0 + KEEP_VERSIONS


def test_params_store_waits_end_when_the_run_stops():
    stop = threading.Event()
    store = ParamsStore([jax.devices()[0]], stop)
    thread, out = _in_thread(lambda: store.newest(jax.devices()[0]))
    stop.set()
    thread.join(timeout=5)
    assert isinstance(out.get("error"), StopRequested)


def test_thread_group_stops_the_run_on_a_failure_and_reraises_it():
    stop = threading.Event()
    group = ThreadGroup(stop)
    group.start("worker a", lambda: stop.wait(5))
    group.start("worker b", lambda: 1 / 0)
    assert stop.wait(5)  # the failure stopped the run
    with pytest.raises(WorkerFailed, match="worker b failed: ZeroDivisionError") as failure:
        group.raise_failure()
    assert isinstance(failure.value.__cause__, ZeroDivisionError)
    assert group.join() == []


def test_thread_group_names_threads_that_do_not_stop(monkeypatch):
    monkeypatch.setattr(lifecycle, "JOIN_TIMEOUT_S", 0.1)
    release = threading.Event()
    group = ThreadGroup(threading.Event())
    group.start("stuck", lambda: release.wait(10))  # ignores the stop event
    group.start("polite", lambda: group.stop.wait(10))
    assert group.join() == ["stuck"]
    group.raise_failure()  # nothing failed
    release.set()


def test_run_log_resume_drops_the_records_after_the_checkpoint(tmp_path):
    run_dir = str(tmp_path)
    log = RunLog(run_dir, {"a": 1}, total_env_steps=50, quiet=True)
    for update in range(1, 6):
        log.write({"update": update, "env_steps": 10 * update, "loss": float(update)})
    log.close()
    with pytest.raises(FileExistsError, match="already holds a run"):
        RunLog(run_dir, {"a": 1}, total_env_steps=50, quiet=True)
    resumed = RunLog(run_dir, {"a": 2}, total_env_steps=50, quiet=True, resume_update=3)
    assert [r["update"] for r in resumed.records] == [1, 2, 3]
    resumed.write({"update": 4, "env_steps": 40, "loss": 40.0})
    resumed.close()
    lines = [json.loads(line) for line in open(tmp_path / METRICS_FILE)]
    assert [(r["update"], r["loss"]) for r in lines] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    assert json.load(open(tmp_path / "config.json")) == {"a": 2}  # what the latest segment runs with


def test_shuffled_minibatches_visit_every_sample_once_per_epoch_in_a_new_order():
    n, epochs, minibatches = 12, 3, 4
    batch = {"index": jnp.arange(n), "twice": 2 * jnp.arange(n)}

    def step(count, minibatch):
        return count + 1, minibatch

    count, seen = jax.jit(lambda key: shuffled_minibatches(step, 0, batch, key, epochs, minibatches))(jax.random.key(0))
    np.testing.assert_array_equal(seen["twice"], 2 * seen["index"])  # the fields stay aligned
    seen = seen["index"]
    assert int(count) == epochs * minibatches and seen.shape == (epochs * minibatches, n // minibatches)
    orders = np.asarray(seen).reshape(epochs, n)
    for order in orders:
        assert sorted(order.tolist()) == list(range(n))
    assert len({tuple(order) for order in orders}) == epochs  # each epoch shuffles anew
    epoch_keys = jax.random.split(jax.random.key(0), epochs)  # drawn at once, the orders of one draw per epoch
    np.testing.assert_array_equal(orders, [random_permutation(key, n) for key in epoch_keys])
    with pytest.raises(ValueError, match="5 minibatches do not divide a batch of 12"):
        shuffled_minibatches(step, 0, batch, jax.random.key(0), 1, 5)


@pytest.mark.parametrize("n", [1, 2, 7, 512, PACKED_PERMUTATION_MAX, PACKED_PERMUTATION_MAX + 1])
def test_random_permutation_is_a_permutation_on_either_path(n):
    order = np.asarray(jax.jit(random_permutation, static_argnums=1)(jax.random.key(n), n))
    assert order.dtype == np.int32 and sorted(order.tolist()) == list(range(n))
    if n > 2:
        assert not np.array_equal(order, np.arange(n))


def test_random_permutation_puts_every_element_first_about_equally_often():
    n, draws = 8, 8000
    firsts = jax.jit(jax.vmap(lambda key: random_permutation(key, n)[0]))(jax.random.split(jax.random.key(0), draws))
    counts = np.bincount(np.asarray(firsts), minlength=n)
    expected, sd = draws / n, np.sqrt(draws * (1 / n) * (1 - 1 / n))
    assert np.all(np.abs(counts - expected) < 5 * sd), counts  # 1000 +- 148


def test_a_small_random_permutation_is_one_sort_of_one_operand():
    jaxpr = jax.make_jaxpr(lambda key: random_permutation(key, 512))(jax.random.key(0))
    sorts = [eqn for eqn in jaxpr.jaxpr.eqns if eqn.primitive.name == "sort"]
    assert len(sorts) == 1 and len(sorts[0].invars) == 1
    assert not any(eqn.primitive.name == "top_k" for eqn in jaxpr.jaxpr.eqns)


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path, capsys):
    run_dir = str(tmp_path)
    log = RunLog(run_dir, {}, total_env_steps=30, quiet=True)
    for update in (1, 2, 3):
        log.write({"update": update, "env_steps": 10 * update})
    log.close()
    path = tmp_path / METRICS_FILE
    path.write_text(path.read_text() + '{"update": 4, "env_st')  # what a kill mid-write leaves
    assert [r["update"] for r in read_records(str(path))] == [1, 2, 3]
    assert "dropped its torn last line 4" in capsys.readouterr().err
    resumed = RunLog(run_dir, {}, total_env_steps=30, quiet=True, resume_update=3)
    resumed.close()
    assert [json.loads(line)["update"] for line in open(path)] == [1, 2, 3]  # the file is whole again
    path.write_text('{"update": 1}\nnot json\n{"update": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not a JSON record"):
        read_records(str(path))


def test_evaluation_summary_has_the_standard_error_and_the_seeds():
    from podracer.evaluation import summary

    fields = summary(np.array([[1.0, 3.0], [5.0, 7.0]]), env_steps=1000)
    assert fields["eval_return"] == 4.0 and fields["eval_episodes"] == 4 and fields["eval_env_steps"] == 1000
    np.testing.assert_allclose(fields["eval_return_stderr"], np.std([1, 3, 5, 7], ddof=1) / 2)
    assert fields["eval_return_per_seed"] == [2.0, 6.0] and (fields["eval_return_min"], fields["eval_return_max"]) == (
        1,
        7,
    )


def test_waiting_for_a_sebulba_evaluation_reports_its_progress(monkeypatch):
    """The run's wait for its final evaluation (Atari games can take minutes) prints progress lines."""
    from podracer.agents import PPOConfig, make_ppo
    from podracer.envs.host import HostEnv, HostEnvConfig
    from podracer.evaluation import EvalConfig
    from podracer.sebulba import evaluate
    from podracer.sebulba.evaluate import SebulbaEvaluator

    monkeypatch.setattr(evaluate, "REPORT_SECONDS", 0.0)  # a line at every poll
    env_config = HostEnvConfig()
    env = HostEnv("CartPole-v1", 2, 0, env_config)
    agent = make_ppo(PPOConfig(), env.spec)
    stop = threading.Event()
    evaluator = SebulbaEvaluator(
        agent,
        "CartPole-v1",
        env_config,
        EvalConfig(eval_episodes=4),
        jax.devices()[0],
        seed=0,
        steps_per_update=16,
        to_agent_layout=env.to_agent_layout,
        stop=stop,
    )
    env.close()
    replicated = jax.tree.map(lambda x: x[None], agent.init(jax.random.key(0)))  # as the learner holds it
    evaluator.request(replicated, update=3)
    lines = []

    def evaluation_thread():
        try:
            evaluator.run()
        finally:  # a failing thread ends the wait (as the run's thread group does), not hangs the test
            stop.set()

    thread, out = _in_thread(evaluation_thread)
    try:
        fields = evaluator.collect(wait=True, report=lines.append)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert "error" not in out, out.get("error")
    assert fields["eval_episodes"] == 4 and fields["eval_env_steps"] == 48
    assert lines and all(line.startswith("evaluation: ") and "/4 games over after " in line for line in lines)
    assert evaluator.games[1] >= 8  # a CartPole game lasts at least 8 steps


def test_actor_params_are_packed_into_one_array_and_back_exactly():
    from podracer.parallel import device_mesh, per_device
    from podracer.sebulba.actor import params_packing

    mesh = device_mesh(jax.devices()[:2])
    params = {"dense": {"kernel": jnp.arange(12.0).reshape(3, 4), "bias": -jnp.arange(4.0)}, "log_std": jnp.ones(2)}
    pack, unpack = params_packing(params)
    packed = pack(per_device(params, mesh))  # the learner's replicas: one of them, packed
    assert isinstance(packed, jax.Array) and packed.shape == (18,)
    assert packed.devices() == {jax.devices()[0]}
    jax.tree.map(np.testing.assert_array_equal, jax.jit(unpack)(packed), params)
    mixed = {"w": jnp.ones(3), "count": jnp.int32(7)}  # one flat array would cast the counter: left as it is
    pack, unpack = params_packing(mixed)
    packed = pack(per_device(mixed, mesh))
    jax.tree.map(np.testing.assert_array_equal, packed, mixed)
    assert packed["count"].dtype == jnp.int32 and unpack(packed) is packed


def test_the_unrolled_minibatch_loop_computes_what_the_rolled_one_does():
    batch = {"x": jnp.arange(12.0)}

    def step(total, minibatch):
        return total * 0.5 + minibatch["x"].sum(), minibatch["x"]

    def run(choice):
        loop = lambda key: shuffled_minibatches(step, 1.0, batch, key, 2, 3, resolve_unroll(choice))  # noqa: E731
        return jax.jit(loop)(jax.random.key(0)), jax.jit(loop).lower(jax.random.key(0)).as_text()

    (rolled, rolled_text), (unrolled, unrolled_text) = run("auto"), run("unroll")
    jax.tree.map(np.testing.assert_array_equal, unrolled, rolled)
    assert rolled_text.count("stablehlo.while") > unrolled_text.count("stablehlo.while")  # (threefry has its own)
    with pytest.raises(ValueError, match="unknown minibatch loop 'python'"):
        resolve_unroll("python")
