"""Cleanba's PPO and IMPALA (github.com/vwxyzjn/cleanba), patched to run on today's stack, timed for
``benchmark_sebulba.py --cleanba DIR``.

:func:`prepare` copies ``cleanba/cleanba_ppo.py`` and ``cleanba/cleanba_impala.py``
from a checkout into a directory outside the project and applies :data:`PATCHES`:
the smallest changes that let Cleanba (written for jax 0.4, gym-style envpool
0.8) run on jax 0.10, optax 0.2 and envpool 1.x, one line that reports each
learner update, and one change of substance that the comparison states: its
learner's minibatch ``lax.scan`` (and PPO's epoch scan around it) runs as a Python loop, because XLA:CPU runs the
conv gradients inside a ``scan`` many times slower (measured: 71.5 s per IMPALA
update with the scan, 4.1 s without); and its ResNet's max-pool is podracer's ``max_pool_same`` (the same
function, whose gradient does not make XLA:CPU hold index arrays as large as the input for every unrolled step:
with flax's, Cleanba's PPO at 64 envs x 32 steps asked for 33 GB). Every patch must apply exactly once where
it is meant to, else :func:`prepare` fails naming it (a newer Cleanba has moved on).

:func:`run` times one patched script: a process with the simulated CPU devices it
asks for, stopped after a number of learner updates. Cleanba keeps its own
XLA flags (every device single-threaded: ``--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``), its own env settings (sticky actions, the full
18-action set) and its optimiser (RMSProp); steady-state agent steps/s come from
the learner's updates after the first two (compilation and warm-up), and the
seconds to the end of the first update are reported as the start-up (import,
envpool, compilation).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments.bench_process import worker_env  # noqa: E402

SCRIPTS = ("cleanba_ppo.py", "cleanba_impala.py")
UPDATE_LINE = "CLEANBA_UPDATE"  # the line the timing patch prints after each learner update
HELPERS = """

def _device_put_sharded(shards, devices):  # podracer's patch: jax.device_put_sharded left JAX in 0.8
    mesh = jax.sharding.Mesh(np.array(devices), ("shards",))
    return jax.device_put(jnp.stack(shards), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("shards")))


def _unreplicate(tree):  # podracer's patch: flax 0.12's keeps the axis when there is one learner device
    return jax.tree.map(lambda x: x[0], tree)


def _python_loop_scan(f, carry, xs, length=None):  # podracer's patch: lax.scan unrolled (slow on XLA:CPU)
    outs = []
    for i in range(length or jax.tree.leaves(xs)[0].shape[0]):
        carry, out = f(carry, jax.tree.map(lambda x: x[i], xs))
        outs.append(out)
    return carry, jax.tree.map(lambda *o: jnp.stack(o), *outs)


from podracer.agents.networks import max_pool_same as _max_pool_same  # podracer's patch: the pool podracer uses
"""


class Patch(NamedTuple):
    why: str
    old: str
    new: str
    scripts: tuple[str, ...] = SCRIPTS
    count: int | None = 1  # occurrences per script; None: at least one, all replaced


PATCHES = (
    Patch(
        "keep the simulated CPU devices the benchmark asks for (Cleanba overwrites XLA_FLAGS)",
        'os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false " "intra_op_parallelism_threads=1"',
        'os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + '
        '" --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"',
    ),
    Patch("jax.tree_map left JAX in 0.6", "jax.tree_map(", "jax.tree.map(", count=None),
    Patch("jax.device_put_sharded left JAX in 0.8", "jax.device_put_sharded(", "_device_put_sharded(", count=None),
    Patch(
        "jax.device_put_replicated left JAX in 0.8",
        "learner_keys = jax.device_put_replicated(key, learner_devices)",
        "learner_keys = flax.jax_utils.replicate(key, learner_devices)",
    ),
    Patch(
        "helpers for the patches above, after the imports",
        "from tensorboardX import SummaryWriter\n",
        "from tensorboardX import SummaryWriter\n" + HELPERS,
    ),
    Patch(
        "optax moved update_moment_per_elem_norm to optax.tree_utils",
        "from optax import update_moment_per_elem_norm",
        "from optax.tree_utils import tree_update_moment_per_elem_norm as update_moment_per_elem_norm",
        scripts=("cleanba_impala.py",),
    ),
    Patch(
        "flax 0.12's unreplicate keeps the device axis of an array on one device",
        "flax.jax_utils.unreplicate(",
        "_unreplicate(",
        count=None,
    ),
    Patch(
        "optax moved ScalarOrSchedule to optax and made _scale_by_learning_rate public",
        "from optax._src.alias import ScalarOrSchedule, _scale_by_learning_rate",
        "from optax import ScalarOrSchedule\n"
        "from optax._src.transform import scale_by_learning_rate as _scale_by_learning_rate",
        scripts=("cleanba_impala.py",),
    ),
    Patch(
        "flax 0.12's TrainState.create asks `name in params`",
        "    critic_params: flax.core.FrozenDict\n",
        "    critic_params: flax.core.FrozenDict\n\n    def __contains__(self, name):  # podracer's patch\n"
        "        return False\n",
    ),
    Patch(
        "envpool 1.x's pools have num_envs, single_action_space, ... as read-only properties already",
        "        envs.num_envs = num_envs\n        envs.single_action_space = envs.action_space\n"
        "        envs.single_observation_space = envs.observation_space\n        envs.is_vector_env = True\n",
        "",
    ),
    Patch(
        "envpool 1.x's gym API: recv returns terminated and truncated apart",
        "next_obs, next_reward, next_done, info = envs.recv()",
        "next_obs, next_reward, next_terminated, next_truncated, info = envs.recv()\n"
        "            next_done = next_terminated | next_truncated",
        scripts=("cleanba_impala.py",),
    ),
    Patch(
        "envpool 1.x's gym API: step returns terminated and truncated apart",
        "next_obs, next_reward, next_done, info = envs.step(cpu_action)",
        "next_obs, next_reward, next_terminated, next_truncated, info = envs.step(cpu_action)\n"
        "            next_done = next_terminated | next_truncated",
        scripts=("cleanba_ppo.py",),
    ),
    Patch(
        "envpool 1.x's gym API: reset returns (obs, info)",
        "next_obs = envs.reset()",
        "next_obs, _ = envs.reset()",
        scripts=("cleanba_ppo.py",),
    ),
    Patch(
        "the minibatch scan as a Python loop (XLA:CPU runs conv gradients in a loop many times slower)",
        "jax.lax.scan(\n                update_minibatch,",
        "_python_loop_scan(\n                update_minibatch,",
        scripts=("cleanba_ppo.py",),
    ),
    Patch(
        "the epoch scan around it as a Python loop (same reason)",
        "jax.lax.scan(\n            update_epoch, (agent_state, key), (), length=args.update_epochs",
        "_python_loop_scan(\n            update_epoch, (agent_state, key), (), length=args.update_epochs",
        scripts=("cleanba_ppo.py",),
    ),
    Patch(
        "the minibatch scan as a Python loop (XLA:CPU runs conv gradients in a loop many times slower)",
        "jax.lax.scan(\n            update_minibatch,",
        "_python_loop_scan(\n            update_minibatch,",
        scripts=("cleanba_impala.py",),
    ),
    Patch(
        "the ResNet's max-pool as podracer's (same function; flax's gradient asks XLA:CPU for GBs per step)",
        'nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")',
        "_max_pool_same(x)",
    ),
    Patch(
        "report each learner update (for the benchmark's timing)",
        "        unreplicated_params = _unreplicate(agent_state.params)\n",
        "        unreplicated_params = _unreplicate(agent_state.params)\n"
        f'        print("{UPDATE_LINE}", learner_policy_version, time.time(), flush=True)\n',
    ),
)


def prepare(checkout: str, workdir: str) -> dict[str, str]:
    """Copies Cleanba's two scripts from ``checkout`` into ``workdir`` with :data:`PATCHES` applied; their paths."""
    paths = {}
    os.makedirs(workdir, exist_ok=True)
    for script in SCRIPTS:
        source = os.path.join(checkout, "cleanba", script)
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{checkout}: no cleanba/{script} there (a checkout of vwxyzjn/cleanba)")
        text = open(source).read()
        for patch in PATCHES:
            if script not in patch.scripts:
                continue
            found = text.count(patch.old)
            if (patch.count is None and found == 0) or (patch.count is not None and found != patch.count):
                raise ValueError(
                    f"cleanba/{script}: the patch '{patch.why}' expects {patch.count or 'some'} "
                    f"occurrence(s) of {patch.old!r}, found {found}: this Cleanba is not the one "
                    "the patches were written for (d1f8979)"
                )
            text = text.replace(patch.old, patch.new)
        paths[script] = os.path.join(workdir, script)
        with open(paths[script], "w") as f:
            f.write(text)
    return paths


def run(
    script: str, flags: list[str], devices: int, updates: int, python: str = sys.executable, timeout: float = 1800.0
) -> dict:
    """Runs a prepared Cleanba ``script`` with ``flags`` on ``devices`` simulated CPU devices until its learner
    has made ``updates`` updates (at least 4), then stops it.

    Returns ``startup_s`` (process start to the end of the first update), ``update_s`` (mean seconds per
    update after the second) and ``updates`` (how many were timed). Raises ``RuntimeError`` if it exits or
    times out first: its first line the last error the script printed, then the end of its output.
    """
    if updates < 4:
        raise ValueError(f"updates must be at least 4 (two to warm up, two to time), got {updates}")
    start = time.time()
    child = subprocess.Popen(
        [python, script, *flags],
        cwd=os.path.dirname(script),
        env=worker_env(devices),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    watchdog = threading.Timer(timeout, child.kill)
    watchdog.start()
    stamps, tail = [], []
    try:
        for line in child.stdout:
            tail = (tail + [line])[-40:]
            if line.startswith("Exception in thread"):  # an actor died: the learner would wait for good
                threading.Timer(5.0, child.kill).start()  # after its traceback has come
            if line.startswith(UPDATE_LINE):
                stamps.append(float(line.split()[2]))
                if len(stamps) >= updates:
                    break
    finally:
        watchdog.cancel()
        child.kill()  # Cleanba's actor threads never end on their own
        child.wait()
    if len(stamps) < updates:
        errors = [line.strip() for line in tail if re.match(r"[\w.]*(Error|Exception)\b", line)]
        cause = errors[-1] if errors else "no error printed"
        raise RuntimeError(
            f"stopped after {len(stamps)} of {updates} updates: {cause}\n"
            f"{os.path.basename(script)} {' '.join(flags)}:\n" + "".join(tail)
        )
    timed = stamps[1:]  # from the end of update 2 on
    return {
        "startup_s": stamps[0] - start,
        "update_s": (timed[-1] - timed[0]) / (len(timed) - 1),
        "updates": len(timed) - 1,
    }
