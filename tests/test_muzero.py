"""MuZero: search, transforms, n-step targets, unroll masks, sharded replay, and learning on both architectures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from podracer.agents import MuZeroConfig, make_muzero
from podracer.agents.muzero import UnrollTargets, muzero_loss, n_step_targets, unroll_masks, value_transform
from podracer.agents.replay import can_sample, replay_add, replay_init, replay_sample, sample_mask
from podracer.anakin import AnakinConfig, train
from podracer.cli.presets import ANAKIN_PRESETS, SEBULBA_PRESETS
from podracer.evaluation import OFF as NO_EVALUATION  # training is what these tests look at
from podracer.parallel import device_mesh, shard_map, single_replica
from podracer.types import BatchShape, Discrete, EnvSpec, Trajectory

SPEC = EnvSpec(jax.ShapeDtypeStruct((4,), jnp.float32), Discrete(3))


@pytest.mark.slow
@pytest.mark.parametrize("search", ["gumbel", "muzero"])
def test_search_returns_valid_policies_with_and_without_masks(search):
    agent = make_muzero(MuZeroConfig(search=search, num_simulations=8), SPEC, BatchShape(1, 4, 6))
    params = agent.init(jax.random.key(0)).params
    obs = jax.random.normal(jax.random.key(1), (6, 4))
    out = agent.search(params, obs, jax.random.key(2))
    weights = np.asarray(out.action_weights)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert (weights >= 0).all() and set(np.asarray(out.action)) <= {0, 1, 2}
    invalid = jnp.array([[True, False, False], [False, True, True]] * 3)
    masked = agent.search(params, obs, jax.random.key(3), invalid)
    assert not np.asarray(invalid)[np.arange(6), np.asarray(masked.action)].any()
    np.testing.assert_allclose(np.asarray(masked.action_weights)[np.asarray(invalid)], 0.0, atol=1e-6)
    action, extras, core = agent.act(params, obs, jax.random.key(4), ())
    assert action.shape == (6,) and extras["search_policy"].shape == (6, 3) and extras["search_value"].shape == (6,)
    assert core == () and agent.initial_core(6) == ()  # feed-forward: no core state


def test_value_transform_round_trips():
    tx = value_transform(MuZeroConfig(support_max=10.0, support_bins=41))
    x = jnp.array([-100.0, -3.7, -0.2, 0.0, 0.5, 7.25, 98.0])
    probs = tx.apply(x)
    assert probs.shape == (7, 41)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(tx.apply_inv(probs), x, rtol=1e-3, atol=1e-3)


def test_n_step_targets_by_hand_across_an_episode_end_and_a_truncation():
    # positions 0..6; transition 1 terminates; position 4 is a truncated final obs (transition 4 is a reset step).
    reward = jnp.array([1.0, 2.0, 0.5, 3.0, 0.0, 1.0])
    discount = jnp.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    valid = jnp.array([True, True, True, True, False, True, True])
    values = jnp.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0])
    gamma, n = 0.5, 3
    targets = np.asarray(n_step_targets(reward, discount, valid, values, gamma, n))  # positions 0..3
    expected = [
        1.0 + 0.5 * 2.0,  # the episode terminates after the second reward: no bootstrap
        2.0,  # terminates at once
        0.5 + 0.5 * 3.0 + 0.25 * 50.0,  # truncation at position 4: bootstrap from its value, stop
        3.0 + 0.5 * 50.0,
    ]
    np.testing.assert_allclose(targets, expected, rtol=1e-6)


def test_unroll_masks_absorb_after_termination_and_stop_at_truncation():
    discount = jnp.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    valid = jnp.array([[True, True, True, False, True], [True, True, False, True, True]])
    alive, inside = unroll_masks(discount, valid, 3)
    np.testing.assert_array_equal(alive, [[1, 1, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(inside, [[1, 1, 1, 1], [1, 1, 0, 0]])  # absorbing states are still learnt


def test_muzero_loss_by_hand_with_uniform_logits_masks_and_weights():
    # b = 2 windows, K = 2, A = 4 actions, 5 support bins. With all-zero logits every cross-entropy is
    # log(A) for the policy and log(bins) for value and reward, whatever the targets.
    tx = value_transform(MuZeroConfig(support_max=2.0, support_bins=5))
    b, k, a, bins = 2, 2, 4, 5
    targets = UnrollTargets(
        policy=jnp.full((b, k + 1, a), 1 / a),
        value=jnp.array([[0.5, -1.0, 0.0], [1.5, 0.2, 0.3]]),
        reward=jnp.array([[1.0, 0.0], [-0.5, 0.25]]),
        inside=jnp.array([[1, 1, 1], [1, 1, 0]]),
        weight=jnp.array([1.0, 0.5]),
    )
    logits = (jnp.zeros((b, k + 1, a)), jnp.zeros((b, k + 1, bins)), jnp.zeros((b, k, bins)))
    loss, metrics = single_replica(lambda *x: muzero_loss(*x, targets, tx, value_coef=0.25, reward_coef=1.0))(*logits)
    # per position: scale (1, 1/2, 1/2) x weight; 5 positions inside; times K + 1 = 3 for a sum over the unroll
    weights = [1.0, 0.5, 0.5, 0.5 * 1.0, 0.5 * 0.5]  # window 0: all three; window 1: root and step 1
    policy = np.log(a) * sum(weights) / 5 * 3
    value = np.log(bins) * sum(weights) / 5 * 3
    reward = np.log(bins) * (sum(weights) - 1.0 - 0.5) / 5 * 3  # no reward term at the roots
    np.testing.assert_allclose(metrics["policy_loss"], policy, rtol=1e-6)
    np.testing.assert_allclose(metrics["value_loss"], value, rtol=1e-6)
    np.testing.assert_allclose(metrics["reward_loss"], reward, rtol=1e-6)
    np.testing.assert_allclose(loss, policy + 0.25 * value + reward, rtol=1e-6)


def test_muzero_loss_rewards_logits_that_match_their_targets():
    tx = value_transform(MuZeroConfig(support_max=2.0, support_bins=5))
    targets = UnrollTargets(
        policy=jnp.array([[[1.0, 0.0], [0.0, 1.0]]]),
        value=jnp.array([[1.0, -1.0]]),
        reward=jnp.array([[2.0]]),
        inside=jnp.ones((1, 2)),
        weight=jnp.ones(1),
    )
    matching = (10.0 * (targets.policy - 0.5), 10.0 * tx.apply(targets.value), 10.0 * tx.apply(targets.reward))
    loss_fn = single_replica(lambda *logits: muzero_loss(*logits, targets, tx, 0.25, 1.0)[0])
    assert float(loss_fn(*matching)) < 0.1 * float(loss_fn(*[-x for x in matching]))


def _traj(t, b, start, offset=0.0):
    """A trajectory whose observations encode their absolute time (and an offset per shard)."""
    times = start + jnp.arange(t + 1, dtype=jnp.float32)
    obs = jnp.broadcast_to(times[:, None, None] + offset, (t + 1, b, 4))
    step = jnp.ones((t, b))
    extras = {"search_policy": jnp.full((t, b, 3), 1 / 3), "search_value": jnp.zeros((t, b))}
    return Trajectory(obs, jnp.zeros((t, b), jnp.int32), step, step, jnp.ones((t, b), bool), extras)


def test_replay_keeps_the_last_capacity_steps_and_samples_whole_windows():
    replay = replay_init(_traj(8, 2, 0), capacity=20)
    assert not can_sample(replay, 6, 0)
    for call in range(5):  # 40 steps into 20 slots
        replay = replay_add(replay, _traj(8, 2, call * 8))
    assert int(replay.position) == 40 and int(sample_mask(replay, 6).sum()) == 2 * (20 - 6)
    sample = replay_sample(replay, jax.random.key(0), 512, 6)
    first = np.asarray(sample.obs[:, 0, 0])
    np.testing.assert_array_equal(first, np.asarray(sample.start))
    assert first.min() >= 40 - 20 + 1 and first.max() + 6 <= 40  # inside the stored, completed steps
    np.testing.assert_array_equal(np.diff(np.asarray(sample.obs[..., 0]), axis=1), 1.0)  # consecutive steps


def test_each_device_samples_its_own_replay_shard():
    mesh = device_mesh(jax.devices()[:4])

    def shard(traj_obs_offset, key):
        replay = replay_init(_traj(8, 2, 0), capacity=30)
        for call in range(3):
            replay = replay_add(replay, _traj(8, 2, call * 8, traj_obs_offset[0] * 1000.0))
        return replay_sample(replay, key, 64, 4).obs[None, :, 0, 0]

    offsets = jnp.arange(4, dtype=jnp.float32)
    firsts = jax.jit(shard_map(shard, mesh, (P("device"), P()), P("device")))(offsets, jax.random.key(0))
    firsts = np.asarray(firsts)
    for device in range(4):
        assert (firsts[device] // 1000 == device).all()


@pytest.mark.slow
def test_anakin_muzero_learns_catch():
    """The catch_muzero preset for 140k of its 200k steps. Measured here, mean training return of the last 3 of
    21 log windows: seeds 0/1/2 end at 0.981/0.991/0.991 and first pass 0.9 at 73k/67k/60k steps, so the bar of
    0.8 (90% of balls caught while the search still explores) leaves 0.18 and 67k steps of margin. (At 200k:
    0.962/0.946/0.995, first past 0.9 at 117k/88k/88k.)"""
    preset = ANAKIN_PRESETS["catch_muzero"]
    result = train(
        "muzero",
        MuZeroConfig(**preset["agent_config"]),
        "catch",
        AnakinConfig(**{**preset["anakin"], "total_env_steps": 140_000}, num_devices=1, seed=0),
        quiet=True,
        evaluation=NO_EVALUATION,
    )
    returns = [r["episode_return"] for r in result.records]
    assert returns[0] < 0.0 and np.mean(returns[-3:]) >= 0.8, returns


@pytest.mark.slow
def test_anakin_muzero_learns_breakout_minatar_within_200k_steps():
    """The minatar_muzero preset (16 sampled windows per new step, value weight 1) for 200k of its 500k steps on
    one device, as the results page runs it. Measured (2026-12-08, 2 CPU cores), mean training return of the last
    3 log windows by 200k steps in the page's runs: seeds 0/1/2 at 18.1/9.8/12.4, so the bar of 6 is 3.8 below the
    lowest; the preset as it was (4 windows, value weight 0.25) reached 3.9 on seed 0, a uniformly random policy
    about 0.5."""
    preset = ANAKIN_PRESETS["minatar_muzero"]
    result = train(
        "muzero",
        MuZeroConfig(**preset["agent_config"]),
        preset["env"],
        AnakinConfig(**{**preset["anakin"], "total_env_steps": 200_000}, num_devices=1, seed=0),
        quiet=True,
        evaluation=NO_EVALUATION,
    )
    returns = [r["episode_return"] for r in result.records if r["episode_return"] is not None]
    assert np.mean(returns[-3:]) >= 6.0, returns


def test_prioritised_sampling_follows_priorities_and_reweights():
    replay = replay_init(_traj(8, 2, 0), capacity=20)
    replay = replay_add(replay, _traj(8, 2, 0))
    replay = replay_add(replay, _traj(8, 2, 8))  # steps 0..16 stored; windows of 4 start at 0..12
    priority = jnp.ones_like(replay.priority).at[5, 1].set(10.0)  # step 5 of env 1: 10x the others
    replay = replay._replace(priority=priority)
    sample = replay_sample(replay, jax.random.key(0), 20_000, 4, alpha=1.0, beta=1.0)
    hit = (np.asarray(sample.start) == 5) & (np.asarray(sample.env) == 1)
    slots = int(sample_mask(replay, 4).sum())
    np.testing.assert_allclose(hit.mean(), 10.0 / (slots - 1 + 10.0), rtol=0.1)
    weight = np.asarray(sample.weight)
    np.testing.assert_allclose(weight[hit], 0.1, rtol=1e-5)  # (N p) ** -beta, normalised by the largest
    np.testing.assert_allclose(weight[~hit], 1.0, rtol=1e-5)


@pytest.mark.slow
def test_sebulba_muzero_reaches_400_on_envpool_cartpole_within_100k_steps():
    """The cartpole_muzero preset (16 sampled windows per new step), in throughput mode (not bit-reproducible).
    Measured (2026-12-08, 2 CPU cores), mean return of the last 3 of 20 log windows: seeds 0/1/2 end at 487/500/478
    and first pass 300 at 31k/31k/26k steps; single windows dip to 280-320 at times, which the bar's margin of 78
    below the lowest seed covers once in a seed's last 3 windows."""
    from podracer.sebulba import SebulbaConfig
    from podracer.sebulba import train as sebulba_train

    preset = SEBULBA_PRESETS["cartpole_muzero"]["fit"](8, 2)
    config = SebulbaConfig(**preset["sebulba"], actor_devices="0", learner_devices="1", seed=0)
    assert config.total_env_steps == 100_000  # the budget this test states
    result = sebulba_train(
        "muzero", MuZeroConfig(**preset["agent_config"]), "CartPole-v1", config, quiet=True, evaluation=NO_EVALUATION
    )
    returns = [r["episode_return"] for r in result.records if r["episode_return"] is not None]
    assert np.mean(returns[-3:]) >= 400, returns


@pytest.mark.slow
def test_sebulba_muzero_reanalyses_and_learns_consistency_on_the_learner_devices():
    """Reanalyse and the consistency loss run inside Sebulba's learner step (on the learner device, sharded
    replay): both log finite values once the replay samples, and Reanalyse's fresh targets differ from the
    stored ones."""
    from podracer.sebulba import SebulbaConfig
    from podracer.sebulba import train as sebulba_train

    preset = SEBULBA_PRESETS["cartpole_muzero"]["fit"](8, 2)
    config = SebulbaConfig(
        **{**preset["sebulba"], "total_env_steps": 16 * 16 * 12, "log_interval": 16 * 16 * 4},
        actor_devices="0",
        learner_devices="1,2",
        seed=0,
    )
    agent_config = MuZeroConfig(
        **{**preset["agent_config"], "replay_ratio": 2.0}, reanalyse_fraction=0.5, consistency_coef=1.0
    )
    result = sebulba_train("muzero", agent_config, "CartPole-v1", config, quiet=True, evaluation=NO_EVALUATION)
    learnt = [r for r in result.records if r.get("replay_ready") == 1.0]  # every update of the window learnt
    assert learnt, result.records
    for record in learnt:
        assert np.isfinite(record["consistency_loss"]) and 0.0 <= record["consistency_loss"] <= 2.0, record
        assert np.isfinite(record["reanalyse_kl"]) and record["reanalyse_kl"] > 1e-4, record


def _brute_force_n_step(reward, discount, valid, values, gamma, n):
    """Each position's n-step return by a plain loop over its own steps (one window ``[W]``)."""
    out = []
    for k in range(len(values) - n):
        total, scale = 0.0, 1.0
        for i in range(n):
            total += scale * reward[k + i]
            scale *= gamma * discount[k + i]
            if not valid[k + i + 1]:  # a truncated final observation: bootstrap from it and stop
                break
        out.append(total + scale * values[k + i + 1])
    return out


def test_n_step_returns_bootstrap_once_per_return_as_a_brute_force_loop_does():
    from podracer.agents.muzero import n_step_returns

    rng = np.random.default_rng(0)
    b, w, n, gamma = 64, 16, 10, 0.9
    reward = rng.normal(size=(b, w - 1)).astype(np.float32)
    discount = (rng.random((b, w - 1)) > 0.1).astype(np.float32)  # 10% terminations
    valid = rng.random((b, w)) > 0.1  # 10% truncations
    values = rng.normal(size=(b, w)).astype(np.float32)
    targets = np.asarray(n_step_targets(reward, discount, valid, values, gamma, n))
    expected = [_brute_force_n_step(*row, gamma, n) for row in zip(reward, discount, valid, values)]
    np.testing.assert_allclose(targets, expected, rtol=1e-5, atol=1e-5)
    _, position, scale = n_step_returns(reward, discount, valid, gamma, n)
    ahead = np.asarray(position) - np.arange(w - n)
    assert ahead.min() >= 1 and ahead.max() <= n  # one bootstrap position per return, within its n steps
    assert (np.asarray(scale) == 0).any() and (ahead < n).any()  # the draw has terminations and truncations


def test_consistency_loss_is_one_minus_the_cosine_and_adds_to_the_loss_with_its_weight():
    from podracer.agents.muzero import consistency_loss

    x = jnp.array([[1.0, 2.0, 0.0], [1.0, 0.0, 0.0], [0.0, 3.0, 1.0]])
    y = jnp.array([[3.0, 6.0, 0.0], [0.0, 5.0, 0.0], [0.0, -6.0, -2.0]])
    np.testing.assert_allclose(consistency_loss(x, y), [0.0, 1.0, 2.0], atol=1e-6)  # same way, orthogonal, opposite
    tx = value_transform(MuZeroConfig(support_max=2.0, support_bins=5))
    b, k, a = 2, 2, 3
    targets = UnrollTargets(
        policy=jnp.full((b, k + 1, a), 1 / a),
        value=jnp.zeros((b, k + 1)),
        reward=jnp.zeros((b, k)),
        inside=jnp.array([[1, 1, 1], [1, 1, 0]]),
        weight=jnp.ones(b),
    )
    logits = (jnp.zeros((b, k + 1, a)), jnp.zeros((b, k + 1, 5)), jnp.zeros((b, k, 5)))
    consistency = jnp.array([[0.2, 0.4], [0.6, 0.8]])  # [b, K]; window 1's last step is outside its episode

    def loss(coef):
        return single_replica(
            lambda *x: muzero_loss(*x, targets, tx, 0.25, 1.0, consistency=consistency, consistency_coef=coef)
        )(*logits)

    without, _ = single_replica(lambda *x: muzero_loss(*x, targets, tx, 0.25, 1.0))(*logits)
    total, metrics = loss(3.0)
    # 5 positions inside, counted K + 1 = 3 times (a sum over the unroll); the unrolled steps weigh 1/K each
    expected = (0.2 + 0.4 + 0.6) / 2 / 5 * 3
    np.testing.assert_allclose(metrics["consistency_loss"], expected, rtol=1e-6)
    np.testing.assert_allclose(total, without + 3.0 * expected, rtol=1e-6)


def _filled_sample(config: MuZeroConfig, batch: int):
    """A MuZero agent's model, search and a sample of ``batch`` windows from a replay of random steps."""
    from podracer.agents.muzero import Model, make_network, make_search

    rng = np.random.default_rng(0)
    t, b = 32, 4
    replay = replay_init(_traj(t, b, 0), capacity=100)
    for _ in range(2):
        traj = Trajectory(
            jnp.asarray(rng.normal(size=(t + 1, b, 4)), jnp.float32),
            jnp.asarray(rng.integers(0, 3, (t, b)), jnp.int32),
            jnp.asarray(rng.normal(size=(t, b)), jnp.float32),
            jnp.asarray(rng.random((t, b)) > 0.05, jnp.float32),
            jnp.asarray(rng.random((t, b)) > 0.05),
            {"search_policy": jax.nn.softmax(jnp.asarray(rng.normal(size=(t, b, 3)), jnp.float32) * 3)}
            | {"search_value": jnp.zeros((t, b))},
        )
        replay = replay_add(replay, traj)
    window = config.unroll_steps + config.td_steps + 1
    sample = replay_sample(replay, jax.random.key(1), batch, window)
    model = Model(make_network(config, SPEC), value_transform(config), config.gamma)
    return model, make_search(config, model), sample


@pytest.mark.parametrize("reanalyse_value", [False, True])
def test_reanalyse_takes_the_first_windows_targets_from_one_fresh_search_with_the_target_parameters(
    reanalyse_value,
):
    from podracer.agents.muzero import make_targets, n_step_returns

    config = MuZeroConfig(
        unroll_steps=3, td_steps=4, num_simulations=4, reanalyse_fraction=0.5, reanalyse_value=reanalyse_value
    )
    model, search, sample = _filled_sample(config, batch=8)
    params = model.network.init(jax.random.key(0), jnp.zeros((1, 4)), jnp.zeros((1,), jnp.int32))
    key = jax.random.key(7)
    targets, alive, metrics = single_replica(make_targets(config, model, search, 3))(params, sample, key)
    policy_key, value_key = jax.random.split(key)
    k = config.unroll_steps
    fresh = search(params, sample.obs[:4, : k + 1].reshape(-1, 4), policy_key).action_weights.reshape(4, k + 1, 3)
    uniform = np.full(3, 1 / 3)
    stored = np.asarray(sample.extras["search_policy"][:, : k + 1])
    expected_policy = np.where(np.asarray(alive)[..., None] > 0, np.concatenate([fresh, stored[4:]]), uniform)
    np.testing.assert_allclose(targets.policy, expected_policy, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(fresh) - stored[:4]).max() > 0.1  # the fresh search differs from what was stored
    partial, position, scale = n_step_returns(
        sample.reward[:, :-1], sample.discount[:, :-1], sample.valid, config.gamma, config.td_steps
    )
    at_bootstrap = sample.obs[jnp.arange(8)[:, None], position].reshape(-1, 4)
    bootstrap = np.array(model.root(params, at_bootstrap).value).reshape(8, k + 1)
    if reanalyse_value:
        searched = search(params, at_bootstrap.reshape(8, k + 1, 4)[:4].reshape(-1, 4), value_key)
        bootstrap[:4] = np.asarray(searched.search_tree.summary().value).reshape(4, k + 1)
    np.testing.assert_allclose(targets.value, (partial + scale * bootstrap) * alive, rtol=1e-5, atol=1e-5)
    assert float(metrics["reanalyse_kl"]) > 0.01


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reanalyse-fraction", "1.5"], "--reanalyse-fraction must be at most 1.0, got 1.5"),
        (["--reanalyse-fraction", "-0.1"], "--reanalyse-fraction must be at least 0.0, got -0.1"),
        (["--reanalyse-fraction", "nan"], "--reanalyse-fraction must be a finite number, got nan"),
        (["--reanalyse-value"], "--reanalyse-value re-searches Reanalyse's windows: it needs --reanalyse-fraction"),
        (["--consistency-coef", "-2"], "--consistency-coef must be at least 0.0, got -2.0"),
        (["--consistency-coef", "inf"], "--consistency-coef must be a finite number, got inf"),
        (["--q-floor", "0"], "--q-floor must be positive, got 0.0"),
        (["--projection-size", "1"], "--projection-size must be at least 2, got 1"),
    ],
)
def test_bad_muzero_settings_are_refused_in_one_line_before_anything_starts(tmp_path, capsys, flags, message):
    from podracer.cli.main import main

    run_dir = tmp_path / "run"
    assert main(["anakin", "--preset", "catch_muzero", *flags, "--logdir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()
