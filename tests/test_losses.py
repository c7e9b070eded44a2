"""PPO and IMPALA losses against hand-written numpy references."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from podracer.agents.actor_critic import actor_critic_objective
from podracer.agents.impala import ImpalaConfig, vtrace_loss
from podracer.agents.policies import CategoricalPolicy
from podracer.agents.ppo import PPOConfig, normalized_advantages, ppo_loss
from podracer.parallel import single_replica
from podracer.types import Trajectory


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _ppo_reference(logits, values, action, old_logp, old_value, adv, target, valid, cfg):
    valid = valid.astype(np.float64)
    logp_all = _log_softmax(logits.astype(np.float64))
    logp = logp_all[np.arange(len(action)), action]
    mean = (adv * valid).sum() / valid.sum()
    std = np.sqrt((((adv - mean) ** 2) * valid).sum() / valid.sum())
    adv = (adv - mean) / (std + 1e-8)
    ratio = np.exp(logp - old_logp)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
    policy = -(surrogate * valid).sum() / valid.sum()
    clipped_v = old_value + np.clip(values - old_value, -cfg.clip_eps, cfg.clip_eps)
    v_err = np.maximum((values - target) ** 2, (clipped_v - target) ** 2)
    value = 0.5 * (v_err * valid).sum() / valid.sum()
    entropy = (-(np.exp(logp_all) * logp_all).sum(-1) * valid).sum() / valid.sum()
    return policy + cfg.value_coef * value - cfg.entropy_coef * entropy, policy, value, entropy


def test_ppo_loss_matches_reference_and_ignores_invalid_steps():
    rng = np.random.default_rng(0)
    n, a = 32, 4
    args = dict(
        logits=rng.normal(size=(n, a)).astype(np.float32),
        values=rng.normal(size=n).astype(np.float32),
        action=rng.integers(a, size=n).astype(np.int32),
        old_logp=np.log(rng.uniform(0.1, 0.5, size=n)).astype(np.float32),
        old_value=rng.normal(size=n).astype(np.float32),
        adv=rng.normal(size=n).astype(np.float32),
        target=rng.normal(size=n).astype(np.float32),
        valid=rng.random(n) > 0.25,
    )
    cfg = PPOConfig()

    def loss_fn(logits, values, action, old_logp, old_value, adv, target, valid):
        log_prob, entropy = CategoricalPolicy(a).log_prob_and_entropy(logits, action, {})

        def replica(log_prob, entropy, values, old_logp, old_value, adv, target, valid):
            terms = ppo_loss(
                log_prob, entropy, values, old_logp, old_value, normalized_advantages(adv, valid), target, clip_eps=0.2
            )
            return actor_critic_objective(terms, valid, value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef)

        return single_replica(replica)(log_prob, entropy, values, old_logp, old_value, adv, target, valid)

    loss, metrics = loss_fn(*args.values())
    ref_loss, ref_policy, ref_value, ref_entropy = _ppo_reference(*args.values(), cfg)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["policy_loss"], ref_policy, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["value_loss"], ref_value, rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy"], ref_entropy, rtol=1e-5)
    # Garbage on invalid (auto-reset) steps changes nothing.
    garbage = dict(args)
    for key in ("values", "adv", "target", "old_value"):
        garbage[key] = np.where(args["valid"], args[key], 1e6).astype(np.float32)
    np.testing.assert_allclose(loss_fn(*garbage.values())[0], loss, rtol=1e-6)


def test_ppo_value_clipping_is_optional():
    n = 8
    values, target = jnp.arange(n, dtype=jnp.float32), jnp.zeros(n)
    zeros, log_half = jnp.zeros(n), jnp.log(jnp.full(n, 0.5))
    behaviour_value = values + 100.0  # clipping moves the value to within 0.2 of it: values + 99.8
    for clip_value, error in ((False, values), (True, values + 99.8)):
        terms = ppo_loss(
            log_half, zeros, values, log_half, behaviour_value, zeros, target, clip_eps=0.2, clip_value=clip_value
        )
        np.testing.assert_allclose(terms.value_loss, 0.5 * np.square(error), rtol=1e-5)


def test_impala_loss_matches_vtrace_reference():
    rng = np.random.default_rng(1)
    t, b, a = 6, 2, 3
    logits = rng.normal(size=(t, b, a)).astype(np.float32)
    values = rng.normal(size=(t + 1, b)).astype(np.float32)
    action = rng.integers(a, size=(t, b)).astype(np.int32)
    behaviour_logp = np.log(rng.uniform(0.2, 0.6, size=(t, b))).astype(np.float32)
    traj = Trajectory(
        obs=None,
        action=action,
        reward=rng.normal(size=(t, b)).astype(np.float32),
        discount=np.ones((t, b), np.float32),
        valid=np.ones((t, b), bool),
        extras={"log_prob": behaviour_logp},
    )
    cfg = ImpalaConfig(gamma=0.9)  # and the default lambda (0.95): traces c_t = lambda * min(1, rho_t)
    lam = cfg.vtrace_lambda
    log_prob, entropy = CategoricalPolicy(a).log_prob_and_entropy(logits, action, {})

    def replica(log_prob, entropy, values, traj):
        terms = vtrace_loss(
            log_prob,
            entropy,
            values,
            traj.extras["log_prob"],
            traj.reward,
            traj.discount,
            traj.valid,
            gamma=cfg.gamma,
            vtrace_lambda=lam,
            clip_rho=cfg.clip_rho,
            clip_pg_rho=cfg.clip_pg_rho,
        )
        return actor_critic_objective(terms, traj.valid, value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef)

    loss, metrics = single_replica(replica)(log_prob, entropy, values, traj)

    logp_all = _log_softmax(logits.astype(np.float64))
    logp = np.take_along_axis(logp_all, action[..., None], -1)[..., 0]
    rho = np.exp(logp - behaviour_logp)
    policy_terms, value_terms = [], []
    for j in range(b):
        vs = values[:-1, j].astype(np.float64).copy()
        for s in range(t):  # vs_s = V(x_s) + sum_t gamma^(t-s) (prod c) rho_t delta_t, with the paper's lambda
            weight = 1.0
            for k in range(s, t):
                delta = min(1.0, rho[k, j]) * (traj.reward[k, j] + 0.9 * values[k + 1, j] - values[k, j])
                vs[s] += weight * delta
                weight *= 0.9 * lam * min(1.0, rho[k, j])
        # the policy gradient bootstraps from lambda * vs + (1 - lambda) * V (rlax's V-trace with lambda)
        next_vs = np.append(lam * vs[1:] + (1 - lam) * values[1:-1, j], values[-1, j])
        pg_adv = np.minimum(1.0, rho[:, j]) * (traj.reward[:, j] + 0.9 * next_vs - values[:-1, j])
        policy_terms.append(-logp[:, j] * pg_adv)
        value_terms.append(0.5 * (vs - values[:-1, j]) ** 2)
    entropy = -(np.exp(logp_all) * logp_all).sum(-1).mean()
    np.testing.assert_allclose(metrics["policy_loss"], np.mean(policy_terms), rtol=1e-4)
    np.testing.assert_allclose(metrics["value_loss"], np.mean(value_terms), rtol=1e-4)
    np.testing.assert_allclose(loss, np.mean(policy_terms) + 0.5 * np.mean(value_terms) - 0.01 * entropy, rtol=1e-4)


def test_the_learner_takes_conv_batches_in_slices_with_the_same_result(monkeypatch):
    """On CPU a conv torso is applied in slices, some side by side in each iteration of a loop (faster
    gradients); outputs, loss and gradients are unchanged."""
    import jax

    from podracer.agents import actor_critic
    from podracer.types import Discrete, EnvSpec

    spec = EnvSpec(jax.ShapeDtypeStruct((36, 36, 4), jnp.uint8), Discrete(3))  # Nature CNN: 8x8, 3x3, 1x1
    vectors = EnvSpec(jax.ShapeDtypeStruct((8,), jnp.float32), Discrete(3))
    config = ImpalaConfig(torso="nature_cnn", shared_torso=True)
    parts = actor_critic.build(config, spec, None)
    assert parts.learner_slice == actor_critic.CPU_CONV_SLICE_ELEMENTS // (36 * 36 * 4)  # 101 rows
    assert actor_critic.build(ImpalaConfig(), vectors, None).learner_slice is None  # an MLP: whole batches
    sliced = parts._replace(learner_slice=7)  # 20 rows: 3 slices of at most 7, 2 side by side -> 4 slices of 5
    monkeypatch.setattr(actor_critic, "SLICES_PER_ITERATION", 2)
    obs = jnp.asarray(np.random.default_rng(0).integers(0, 255, (20, 36, 36, 4)), jnp.uint8)
    params = parts.network.init(jax.random.key(0), obs[:1])

    def loss(parts_, params_):
        logits, values = actor_critic.apply_network(parts_, params_, obs)
        return jnp.sum(jax.nn.log_softmax(logits)[:, 0] * values)

    whole, whole_grads = jax.value_and_grad(lambda p: loss(parts, p))(params)
    part, part_grads = jax.value_and_grad(lambda p: loss(sliced, p))(params)
    np.testing.assert_allclose(part, whole, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(part_grads), jax.tree.leaves(whole_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    jaxpr = str(jax.make_jaxpr(lambda p: loss(sliced, p))(params))
    assert jaxpr.count("conv_general_dilated") == 3  # three Nature-CNN convs, in one loop over the slices
    assert "scan[" in jaxpr and "length=4" in jaxpr and "unroll=2" in jaxpr  # 2 iterations of 2 slices


def _uniform_behaviour_trajectory(T: int, B: int) -> Trajectory:
    """``T`` steps of ``B`` sequences: 6-d observations, 3 actions drawn by a uniform behaviour policy (seeded)."""
    rng = np.random.default_rng(0)
    return Trajectory(
        obs=jnp.asarray(rng.normal(size=(T + 1, B, 6)), jnp.float32),
        action=jnp.asarray(rng.integers(0, 3, (T, B)), jnp.int32),
        reward=jnp.asarray(rng.normal(size=(T, B)), jnp.float32),
        discount=jnp.full((T, B), 0.99, jnp.float32),
        valid=jnp.ones((T, B), bool),
        extras={"log_prob": jnp.full((T, B), -np.log(3.0), jnp.float32)},
    )


def test_ppo_with_a_shared_torso_learns_from_the_values_its_actors_computed():
    """With one torso the actors' extras carry the values (as CleanRL's rollouts keep them) and the learner takes
    them, computing only the bootstrap value; with two torsos acting runs the actor's torso alone."""
    import jax

    from podracer.agents import actor_critic, make_ppo
    from podracer.agents.networks import ActorCritic
    from podracer.agents.returns import generalized_advantages
    from podracer.types import Discrete, EnvSpec

    spec = EnvSpec(jax.ShapeDtypeStruct((6,), jnp.float32), Discrete(3))
    config = PPOConfig(shared_torso=True, num_epochs=1, num_minibatches=1, normalize_advantages=False)
    agent = make_ppo(config, spec)
    T, B = 5, 4
    traj = _uniform_behaviour_trajectory(T, B)
    state = agent.init(jax.random.key(0))
    params = agent.actor_params(state)
    act = jax.jit(agent.act)
    acted = [act(params, obs, jax.random.key(t), ()) for t, obs in enumerate(traj.obs[:-1])]
    extras = jax.tree.map(lambda *steps: jnp.stack(steps), *[extras for _, extras, _ in acted])
    traj = traj._replace(action=jnp.stack([action for action, _, _ in acted]), extras=extras)
    network = actor_critic.build(config, spec, None).network
    values = network.apply(state.params, traj.obs.reshape(-1, 6), method=ActorCritic.value).reshape(T + 1, B)
    np.testing.assert_allclose(extras["value"], values[:-1], rtol=1e-5, atol=1e-6)
    target = (
        generalized_advantages(traj.reward, traj.discount, traj.valid, values, config.gamma, config.gae_lambda)
        + values[:-1]
    )
    learn = jax.jit(single_replica(agent.learn))
    metrics = learn(state, traj, jax.random.key(1))[1]
    np.testing.assert_allclose(metrics["value_loss"], 0.5 * jnp.mean(jnp.square(values[:-1] - target)), rtol=1e-5)
    shifted = traj._replace(extras={**extras, "value": extras["value"] + 1.0})  # the learner reads these
    assert not np.isclose(learn(state, shifted, jax.random.key(1))[1]["value_loss"], metrics["value_loss"])
    two_torsos = make_ppo(dataclasses.replace(config, shared_torso=False), spec)
    _, two_torso_extras, _ = two_torsos.act(
        two_torsos.actor_params(two_torsos.init(jax.random.key(0))), traj.obs[0], jax.random.key(0), ()
    )
    assert set(two_torso_extras) == {"log_prob"}


def test_impala_minibatches_are_gradient_steps_on_shuffled_whole_sequences():
    """``--num-minibatches 2`` on 2 sequences: one gradient step on each sequence, in an order the key draws."""
    import jax

    from podracer.agents import make_impala
    from podracer.types import Discrete, EnvSpec

    spec = EnvSpec(jax.ShapeDtypeStruct((6,), jnp.float32), Discrete(3))
    one_step, two_steps = (make_impala(ImpalaConfig(num_minibatches=n), spec) for n in (1, 2))
    T, B = 5, 2
    traj = _uniform_behaviour_trajectory(T, B)
    sequence = [jax.tree.map(lambda x, b=b: x[:, b : b + 1], traj) for b in range(B)]
    state = one_step.init(jax.random.key(0))
    learn_one, learn_two = (jax.jit(single_replica(agent.learn)) for agent in (one_step, two_steps))  # traced once
    key = jax.random.key(1)

    def in_order(first, second):
        return learn_one(learn_one(state, sequence[first], key)[0], sequence[second], key)[0].params

    orders = {(0, 1): in_order(0, 1), (1, 0): in_order(1, 0)}
    seen = set()
    for k in range(8):
        params = learn_two(state, traj, jax.random.key(k))[0].params
        matches = [
            order
            for order, expected in orders.items()
            if all(
                np.allclose(a, b, rtol=1e-5, atol=1e-7)
                for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected))
            )
        ]
        assert len(matches) == 1, k
        seen.add(matches[0])
    assert seen == set(orders)  # the key shuffles
    with pytest.raises(ValueError, match="--num-minibatches 2 does not divide"):
        single_replica(two_steps.learn)(state, jax.tree.map(lambda x: x[:, :1], traj), key)


def test_rmsprop_steps_as_pytorch_and_the_summed_loss_is_the_mean_times_the_batch():
    """The paper's/Cleanba's IMPALA optimiser: ``g / (sqrt(nu) + eps)``, eps outside the root, no momentum; and
    ``--summed-loss`` scales the loss (so the gradient) by the steps x sequences of the gradient step."""
    import jax

    from podracer.agents import make_impala
    from podracer.agents.actor_critic import build
    from podracer.types import Discrete, EnvSpec

    spec = EnvSpec(jax.ShapeDtypeStruct((6,), jnp.float32), Discrete(3))
    config = ImpalaConfig(
        optimizer="rmsprop", learning_rate=0.1, rmsprop_decay=0.9, rmsprop_eps=0.5, max_grad_norm=1e9, anneal_lr=False
    )
    optimizer = build(config, spec, None).optimizer
    params = {"w": jnp.zeros(3)}
    grads = [{"w": jnp.array([1.0, -2.0, 0.0])}, {"w": jnp.array([3.0, 1.0, 4.0])}]
    state, nu = optimizer.init(params), np.zeros(3)
    for g in grads:
        updates, state = optimizer.update(g, state, params)
        nu = 0.9 * nu + 0.1 * np.square(g["w"])
        np.testing.assert_allclose(updates["w"], -0.1 * g["w"] / (np.sqrt(nu) + 0.5), rtol=1e-6)

    T, B = 5, 4
    traj = _uniform_behaviour_trajectory(T, B)
    metrics = {}
    for summed in (False, True):
        agent = make_impala(ImpalaConfig(summed_loss=summed, max_grad_norm=1e9, num_minibatches=1), spec)
        _, metrics[summed] = single_replica(agent.learn)(agent.init(jax.random.key(0)), traj, jax.random.key(1))
    np.testing.assert_allclose(metrics[True]["loss"], T * B * metrics[False]["loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics[True]["grad_norm"], T * B * metrics[False]["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(metrics[True]["policy_loss"], metrics[False]["policy_loss"], rtol=1e-6)
    with pytest.raises(ValueError, match="--optimizer must be one of"):
        make_impala(ImpalaConfig(optimizer="sgd"), spec)
    with pytest.raises(ValueError, match="--rmsprop-decay must be at most 0.9999"):
        make_impala(ImpalaConfig(optimizer="rmsprop", rmsprop_decay=1.0), spec)
