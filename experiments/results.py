"""Trains a results suite and writes the results page (``docs/results.md``).

    python experiments/results.py --suite classic            # every agent x architecture, ~12 min on 2 CPU cores
    python experiments/results.py --suite minatar --purejaxrl ~/purejaxrl --purejaxrl-python ~/pjx/bin/python
    python experiments/results.py --suite atari --max-minutes 60   # stops resumably after an hour; rerun to go on
    python experiments/results.py --suite atari --only sebulba-impala-pong-v5-4mb   # one entry; the rest kept

Each run is a ``podracer`` command in a process of its own, in
``RUNS_DIR/<suite>/<run>`` with ``--resume-or-start``, so a suite that was
stopped (Ctrl-C, SIGTERM, a preemption, ``--max-minutes``) continues when the
same command runs again: finished runs are reused, an unfinished one resumes
from its checkpoint. The suites (presets, budgets, seeds, published figures)
are in ``experiments/suites.py``.

After every call the suite's numbers go to ``docs/results/<suite>.json`` and
its figures (one per environment: the mean over seeds with a 95% bootstrap
interval, training and evaluation returns, against env steps or frames and
against training seconds) to ``docs/results/<suite>-<env>.png``; the page is
rewritten from every suite's numbers. An entry whose runs are not here (a fresh
checkout) or not finished keeps the numbers recorded for it, as long as its
definition is unchanged (steps, seeds, and the settings its preset and flags give, recorded with the
numbers); the page says which
numbers are from an earlier call. ``--purejaxrl DIR`` trains PureJaxRL's PPO
beside the entries that name it; without it, the PureJaxRL figures recorded
last are kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments.suites import SEBULBA_CPU, SUITES, Entry, Suite  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_FILE = "suite_run.json"  # in each run directory: the segments run and whether the run finished
STOPPED = 3  # exit code of a suite stopped before its end (resumable)
# a run's exit codes that are not failures: finished, stopped by SIGINT/SIGTERM, or killed by one before it started
STOP_CODES = (0, 130, 143, -signal.SIGINT, -signal.SIGTERM)
PAGE_INTRO = """# Results

Learning curves and final scores of podracer's agents on standard benchmarks, written by
`python experiments/results.py --suite NAME` (the suites are in `experiments/suites.py`). Each curve is the
mean over seeds of the training return (episodes ending in each log window, exploration included) with a
95% bootstrap interval over seeds (with 3 seeds a rough one), and of the evaluation return (greedy, on
environments seeded apart) where the run evaluates. A **final** score is the mean of a seed's last 3 log
windows (training) or its last evaluation, then the mean over seeds with its interval. Wall time is the
whole command (start, compilation, evaluation and training); steps/s is training throughput (agent steps
of every seed per training second, compilation excluded). Frames = agent steps x frame skip (4 on Atari).
Where an entry trained for a third of the longest entry's steps or less, a third panel shows the curves over
its budget alone, so that short runs can be compared with the others at equal steps.
"""


def _run_state(run_dir: str) -> dict:
    path = os.path.join(run_dir, STATE_FILE)
    if not os.path.exists(path):
        return {"segments": [], "finished": False}
    with open(path) as f:
        return json.load(f)


def _save_run_state(run_dir: str, state: dict) -> None:
    with open(os.path.join(run_dir, STATE_FILE) + ".tmp", "w") as f:
        json.dump(state, f, indent=1)
    os.replace(os.path.join(run_dir, STATE_FILE) + ".tmp", os.path.join(run_dir, STATE_FILE))


def run_to_end(entry: Entry, seed: int, run_dir: str, deadline: float) -> bool:
    """Trains one run to its end, or until ``deadline`` (``time.time()``); whether it finished.

    The run goes on from wherever an earlier call left it. Raises
    ``KeyboardInterrupt`` after the run has stopped and checkpointed when the
    suite is interrupted, and ``RuntimeError`` when ``podracer`` fails.
    """
    state = _run_state(run_dir)
    if state["finished"]:
        print(f"results: {os.path.basename(run_dir)} finished earlier: reused", flush=True)
        return True
    if time.time() >= deadline:
        return False
    command = [
        sys.executable,
        "-m",
        "podracer.cli.main",
        *entry.command(seed),
        "--logdir",
        run_dir,
        "--resume-or-start",
        "--log-interval",
        str(max(1, entry.steps // 50)),
    ]
    print(f"results: {' '.join(['podracer', *command[3:]])}", flush=True)
    os.makedirs(run_dir, exist_ok=True)
    start = time.time()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    timer = threading.Timer(max(0.0, deadline - start), child.send_signal, (signal.SIGTERM,))
    timer.start()
    result_line, interrupted = None, None
    try:
        for line in child.stdout:
            print(line, end="", flush=True)
            if line.startswith("RESULT "):
                result_line = line.split()[1:]
        child.wait()
    except KeyboardInterrupt as interrupt:
        # Ctrl-C in a terminal reaches the child too, but a signal sent to this process alone (`kill`, `timeout`,
        # a scheduler's SIGTERM) must be passed on, or the child trains on. A run stops once however often told.
        interrupted = interrupt
        child.send_signal(getattr(signal, _signal_name(interrupt)))
        child.wait()
    finally:
        timer.cancel()
    result = dict(field.split("=", 1) for field in result_line or [])
    finished = child.returncode == 0 and "stopped_by" not in result
    state["segments"].append({"wall_seconds": round(time.time() - start, 1), "exit_code": child.returncode})
    state["finished"] = finished
    if finished:
        state["compile_seconds"] = float(result.get("compile_s", "nan"))
    _save_run_state(run_dir, state)
    if interrupted:
        raise interrupted
    if child.returncode not in STOP_CODES:
        raise RuntimeError(f"{' '.join(command[3:])} failed (exit code {child.returncode}); see its output above")
    return finished


def _curves(run_dirs: list[str], metric: str, x_key: str) -> dict | None:
    """The mean curve over every seed of ``run_dirs`` (see ``podracer.plot.aggregate_runs``) and its time axis."""
    from podracer.plot import aggregate_runs, read_metrics

    try:
        (group,) = aggregate_runs(run_dirs, metric, "mean", x_key=x_key).values()
    except ValueError:  # nothing logged (e.g. no evaluation)
        return None
    times = []
    for run_dir in run_dirs:
        records = [r for r in read_metrics(run_dir) if r.get(x_key) is not None]
        times.append(np.interp(group["env_steps"], [r[x_key] for r in records], [r["time"] for r in records]))
    group["seconds"] = np.mean(times, axis=0).tolist()
    return group


def summarise(entry: Entry, run_dirs: list[str]) -> dict:
    """An entry's numbers for the page: curves, finals, timings (from its finished runs)."""
    from podracer.plot import read_metrics

    states = [_run_state(d) for d in run_dirs]
    preset = preset_settings(entry)
    last = [read_metrics(d)[-1] for d in run_dirs]
    train_seconds = sum(r["time"] for r in last)
    return {
        "name": entry.name,
        "architecture": entry.architecture,
        "agent": entry.agent,
        "env": entry.env,
        "preset": entry.preset,
        "preset_settings": preset,
        "flags": list(entry.flags),
        "settings": run_settings(entry.architecture, entry.agent, preset, entry.flags),
        "seeds": entry.seeds,
        "steps": entry.steps,
        "frame_skip": entry.frame_skip,
        "reference": _reference(entry),
        "train": _curves(run_dirs, "episode_return", "env_steps"),
        "eval": _curves(run_dirs, "eval_return", "eval_env_steps"),
        "wall_seconds": round(sum(s["wall_seconds"] for state in states for s in state["segments"]), 1),
        "compile_seconds": round(float(np.mean([s.get("compile_seconds", np.nan) for s in states])), 1),
        "train_seconds": round(train_seconds, 1),
        "sps": round(sum(r["env_steps"] for r in last) / max(train_seconds, 1e-9)),
        "runs": len(run_dirs),
        "segments": sum(len(state["segments"]) for state in states),
        "measured": _machine(),
    }


def run_peer(entry: Entry, purejaxrl: str, python: str) -> dict:
    """PureJaxRL's PPO on ``entry``'s env, budget and seeds, in a process of its own (see peer_purejaxrl.py)."""
    env = entry.env.split(":", 1)[1]
    command = [
        python,
        os.path.join(ROOT, "experiments", "peer_purejaxrl.py"),
        "--env",
        env,
        "--steps",
        str(entry.steps),
        "--seeds",
        str(entry.seeds),
    ]
    print(f"results: PureJaxRL PPO on {env}, {entry.steps:,} steps x {entry.seeds} seeds", flush=True)
    pythonpath = os.pathsep.join(filter(None, [os.path.join(purejaxrl, "purejaxrl"), os.environ.get("PYTHONPATH")]))
    start = time.time()
    out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": pythonpath})
    lines = [line for line in out.stdout.splitlines() if line.startswith("PEER ")]
    if out.returncode or not lines:
        raise RuntimeError(f"PureJaxRL on {env} failed:\n{out.stderr[-3000:]}")
    peer = json.loads(lines[-1][len("PEER ") :])
    returns = np.array([[np.nan if v is None else v for v in row] for row in peer["returns"]])  # [windows, seeds]
    finals = np.nanmean(returns[-3:], axis=0)
    from podracer.aggregate import bootstrap

    final = bootstrap(finals[:, None], "mean")
    peer.update(
        steps=entry.steps,
        wall_seconds=round(time.time() - start, 1),
        final={
            "point": float(final.point[0]),
            "low": float(final.low[0]),
            "high": float(final.high[0]),
            "per_run": finals.tolist(),
        },
    )
    return peer


def _slug(env: str) -> str:
    return env.split(":")[-1].lower()


def _zoom_limit(entries: list[dict]) -> float | None:
    """The x limit (agent steps) of a panel for the short runs, where some entry trained at most a third of the
    longest's steps (their curves would sit in the first third of the axis); None where none did."""
    longest = max(entry["steps"] for entry in entries)
    short = [entry["steps"] for entry in entries if entry["steps"] * 3 <= longest]
    return max(short) * 1.05 if short else None


def plot_env(suite_name: str, env: str, entries: list[dict], peers: dict, out: str) -> None:
    """One figure per environment: every entry's (and peer's) mean return against steps (or frames) and seconds,
    and against the first steps where some entry's budget is a third of the longest's or less."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    skip = entries[0]["frame_skip"]
    zoom = _zoom_limit(entries)
    fig, axes = plt.subplots(1, 3 if zoom else 2, figsize=(16.5 if zoom else 11, 4), constrained_layout=True)
    by_steps, by_time = axes[:2]
    panels = [(by_steps, "steps", None), (by_time, "seconds", None)] + (
        [(axes[2], "steps", zoom * skip)] if zoom else []
    )

    def draw(xs: dict, y, low=None, high=None, **style) -> None:  # xs: {"steps": [N], "seconds": [N]}
        for axis, x_name, limit in panels:
            x = np.asarray(xs[x_name], float)
            shown = x <= limit if limit else np.ones(len(x), bool)
            axis.plot(x[shown], np.asarray(y, float)[shown], **style)
            if low is not None:
                axis.fill_between(
                    x[shown],
                    np.asarray(low, float)[shown],
                    np.asarray(high, float)[shown],
                    color=style["color"],
                    alpha=0.2,
                )

    for i, entry in enumerate(entries):
        color = f"C{i}"
        label = f"{entry['agent'].upper()} ({entry['architecture']}{_shown_flags(entry, ', ')})"
        for kind, style in (("train", "-"), ("eval", "--")):
            curve = entry[kind]
            if curve is None:
                continue
            draw(
                {"steps": np.array(curve["env_steps"]) * skip, "seconds": curve["seconds"]},
                curve["point"],
                curve["low"],
                curve["high"],
                linestyle=style,
                color=color,
                marker="o" if kind == "eval" else None,
                markersize=3,
                label=f"{label} {'training' if kind == 'train' else 'evaluation'}",
            )
        reference = entry["reference"]
        if reference and i == 0:
            for axis, x_name, _ in panels:
                if x_name == "steps":
                    axis.axhline(
                        reference["value"],
                        color="gray",
                        linestyle=":",
                        label=f"reference: {reference['source']}",
                    )
    peer = peers.get(env)
    if peer:
        returns = np.array([[np.nan if v is None else v for v in row] for row in peer["returns"]])
        ended = np.isfinite(returns).any(axis=1)  # windows where some seed ended an episode (Freeway's are long)
        steps = np.array(peer["env_steps"])[ended]
        seconds = steps / peer["env_steps"][-1] * peer["train_s"] / peer["seeds"]  # the seeds ran in turn
        mean = np.nanmean(returns[ended], axis=1)
        draw({"steps": steps, "seconds": seconds}, mean, color="black", label=f"{peer['peer']} training")
    steps_label = "frames" if skip > 1 else "environment steps (per seed)"
    for axis, x_name, limit in panels:
        axis.set_xlabel(steps_label if x_name == "steps" else "training seconds (compilation excluded)")
        if limit:
            axis.set_xlabel(f"{steps_label}, the first {limit / 1.05:,.0f}")  # the zoom's limit has 5% to spare
            axis.set_xlim(0, limit)
        axis.set_ylabel("return (mean over seeds, 95% interval)")
        axis.grid(alpha=0.3)
    by_steps.legend(fontsize="x-small")
    fig.suptitle(f"{env} ({suite_name})")
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _shown_flags(entry: dict, prefix: str) -> str:
    """The flags an entry adds to its preset, other than the CPU device split (``prefix`` before them)."""
    flags = entry.get("flags", [])
    if flags[: len(SEBULBA_CPU)] == list(SEBULBA_CPU):
        flags = flags[len(SEBULBA_CPU) :]
    return f"{prefix}{' '.join(flags)}" if flags else ""


def _interval(final: dict | None) -> str:
    if not final:
        return "-"
    return f"{final['point']:.4g} [{final['low']:.4g}, {final['high']:.4g}]"


def _eval_final(curve: dict | None) -> dict | None:
    """The last evaluation of every seed: the curve's last point and interval (evaluations are per seed)."""
    if curve is None:
        return None
    return {"point": curve["point"][-1], "low": curve["low"][-1], "high": curve["high"][-1]}


def _verdict(entry: dict) -> str:
    """The final score against the reference figure: the last evaluation where there is one, or the training
    return where the reference is a training curve (or the run does not evaluate)."""
    reference = entry["reference"]
    if reference is None:
        return ""
    evaluation = None if reference.get("of") == "training" else _eval_final(entry["eval"])
    final = evaluation or entry["train"]["final"]
    if final["high"] < reference["value"]:
        return f"below the reference by {reference['value'] - final['point']:.3g}"
    if final["point"] >= reference["value"]:
        return "reaches the reference"
    return f"below by {reference['value'] - final['point']:.3g} in the mean; the interval reaches it"


def _reference_cell(reference: dict | None) -> str:
    if reference is None:
        return "-"
    against = "; against the training return" if reference.get("of") == "training" else ""
    return f"{reference['value']:g} ({reference['source']}{against})"


def suite_section(name: str, suite: Suite, data: dict, docs: str) -> list[str]:
    """The page's markdown for one suite (figures written into ``docs/results``)."""
    lines = [
        f"## Suite `{name}`",
        "",
        suite.about,
        "",
        f"Command: `python experiments/results.py --suite {name}`; measured {data['measured']}.",
        "",
    ]
    entries = [e for e in data["entries"] if e is not None]
    envs = list(dict.fromkeys(e["env"] for e in entries))
    lines += [
        "| agent | architecture | env | preset | agent steps per seed (frames) | seeds | final training return "
        "[95% CI] | final evaluation return [95% CI] | reference | verdict | wall | training steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        frames = f" ({e['steps'] * e['frame_skip']:,})" if e["frame_skip"] > 1 else ""
        reference = _reference_cell(e["reference"])
        resumed = f" in {e['segments']} segments" if e["segments"] > e["runs"] else ""
        lines.append(
            f"| {e['agent']} | {e['architecture']} | `{e['env']}` | `{e['preset']}{_shown_flags(e, ' ')}` | {e['steps']:,}{frames} | "
            f"{e['seeds']} | {_interval(e['train']['final'])} | {_interval(_eval_final(e['eval']))} | "
            f"{reference} | {_verdict(e)} | {e['wall_seconds']:.0f} s{resumed} | {e['sps']:,} |"
        )
    for env, peer in data.get("peers", {}).items():
        lines.append(
            f"| PureJaxRL PPO | (its own) | `{env}` | PureJaxRL's MinAtar config | {peer['env_steps'][-1]:,} | "
            f"{peer['seeds']} | {_interval(peer['final'])} | - | - | - | {peer['wall_seconds']:.0f} s | "
            f"{peer['sps']:,} |"
        )
    earlier = [
        f"{e['name']} (measured {e['measured']})"
        for e in entries
        if e.get("measured", data["measured"]) != data["measured"]
    ]
    if earlier:
        lines += [
            "",
            f"Recorded by an earlier call and kept (their runs are not in this checkout, or were not "
            f"trained by this call): {', '.join(earlier)}.",
        ]
    missing = [n for n, e in zip(data["names"], data["entries"]) if e is None]
    if missing:
        lines += ["", f"Not finished yet (run the command again to continue): {', '.join(missing)}."]
    lines.append("")
    for env in envs:
        figure = f"results/{name}-{_slug(env)}.png"
        plot_env(name, env, [e for e in entries if e["env"] == env], data.get("peers", {}), os.path.join(docs, figure))
        lines += [f"![{env}]({figure})", ""]
    return lines


def write_page(docs: str) -> str:
    """Rewrites ``docs/results.md`` from every suite's recorded numbers; returns its path."""
    lines = [PAGE_INTRO]
    for name, suite in SUITES.items():
        path = os.path.join(docs, "results", f"{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                lines += suite_section(name, suite, json.load(f), docs)
        else:
            lines += [
                f"## Suite `{name}`",
                "",
                suite.about,
                "",
                f"Not run yet: `python experiments/results.py --suite {name}`.",
                "",
            ]
    page = os.path.join(docs, "results.md")
    others = _other_sections(page)  # read before opening the page for writing empties it
    with open(page, "w") as f:
        f.write("\n".join(lines) + others)
    return page


def _other_sections(page: str) -> str:
    """The top-level sections (``# ...``) that other scripts wrote into ``page`` after the suites' (e.g.
    experiments/pbt_results.py's), kept as they are."""
    if not os.path.exists(page):
        return ""
    old = open(page).read().splitlines(keepends=True)
    starts = [i for i, line in enumerate(old) if line.startswith("# ") and i > 0]
    return "\n" + "".join(old[starts[0] :]) if starts else ""


def _stopped(max_minutes: float) -> int:
    print(f"results: stopped after --max-minutes {max_minutes}; run the same command to continue", file=sys.stderr)
    return STOPPED


def _signal_name(interrupt: KeyboardInterrupt) -> str:
    return interrupt.args[0] if interrupt.args else "SIGINT"  # SIGTERM's handler names it; Ctrl-C's does not


def _interrupted(interrupt: KeyboardInterrupt) -> int:
    name = _signal_name(interrupt)
    print(f"results: stopped by {name}; run the same command to continue", file=sys.stderr)
    return 128 + getattr(signal, name)


DEFINING_FIELDS = ("architecture", "agent", "env", "preset", "seeds", "steps")  # with the settings of
# :func:`run_settings`: an entry's recorded numbers stand for it while these are unchanged
FINGERPRINT_HOST = (2, 2)  # (devices, cores): a host-dependent preset's settings are compared as fitted to this host


def preset_settings(entry: Entry) -> dict:
    """What ``entry``'s preset sets (a host-dependent one as fitted to :data:`FINGERPRINT_HOST`), JSON-shaped:
    a preset changed since a run was recorded makes its numbers stale."""
    from podracer.cli.presets import ANAKIN_PRESETS, SEBULBA_PRESETS

    preset = {"anakin": ANAKIN_PRESETS, "sebulba": SEBULBA_PRESETS}[entry.architecture][entry.preset]
    settings = preset["fit"](*FINGERPRINT_HOST) if "fit" in preset else preset
    return json.loads(json.dumps({key: settings[key] for key in settings if key not in ("about", "fit")}))


def run_settings(architecture: str, agent: str, preset: dict, flags) -> dict:
    """Every setting a run trains with, JSON-shaped: each field of the architecture's flag groups and of
    ``agent``'s config, ``flags`` over ``preset`` (what the preset sets, as :func:`preset_settings` gives it)
    over the fields' defaults. A setting that moved between a preset and an entry's flags leaves them equal."""
    from podracer.agents import AGENTS
    from podracer.cli.main import ANAKIN, SAVED_GROUPS, SEBULBA
    from podracer.config import add_flags

    arch = {"anakin": ANAKIN, "sebulba": SEBULBA}[architecture]
    groups = [(SAVED_GROUPS[title], cls) for title, cls in arch.config_groups] + [("agent_config", AGENTS[agent][0])]
    settings = {}
    for key, cls in groups:
        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        add_flags(parser, cls, preset.get(key, {}))
        settings[key] = vars(parser.parse_known_args(list(flags))[0])
    return json.loads(json.dumps(settings))


def _settings(summary: dict) -> dict:
    """The settings ``summary``'s runs trained with: as recorded, or for a summary recorded before they were
    (2026-12-06), as its preset and flags give them with today's defaults."""
    if "settings" in summary:
        return summary["settings"]
    return run_settings(summary["architecture"], summary["agent"], summary.get("preset_settings", {}), summary["flags"])


def _same_settings(recorded: dict, now: dict, entry: Entry) -> bool:
    """Whether runs recorded with ``recorded`` settings trained as ``now``'s would: every recorded setting equal,
    and a setting added since (a new flag, absent from ``recorded``) at its default, which keeps what the code
    did before the flag existed."""
    defaults = run_settings(entry.architecture, entry.agent, {}, [])
    for group, values in now.items():
        old = recorded.get(group, {})
        for key, value in values.items():
            if (old[key] != value) if key in old else (value != defaults.get(group, {}).get(key)):
                return False
    return all(key in now.get(group, {}) for group, values in recorded.items() for key in values)


def _reference(entry: Entry) -> dict | None:
    return None if entry.reference is None else dataclasses.asdict(entry.reference)


def _recorded(entry: Entry, old: dict) -> dict | None:
    """``entry``'s summary from an earlier call (``old``: the suite's recorded numbers), if it was of the same
    runs: a machine without the run directories (a fresh checkout) keeps the page's finished results."""
    for name, summary in zip(old.get("names", []), old.get("entries", [])):
        if name == entry.name and summary is not None:
            now = {**dataclasses.asdict(entry), "flags": list(entry.flags), "preset_settings": preset_settings(entry)}
            same_runs = all(summary.get(field) == now[field] for field in DEFINING_FIELDS)
            settings = _settings(summary)
            if same_runs and _same_settings(settings, _settings(now), entry):
                # the reference is the suite's, not the run's: a corrected figure applies to recorded numbers too;
                # the runs are labelled as today's definition gives them (their settings are the same)
                return {
                    **summary,
                    "flags": now["flags"],
                    "preset_settings": now["preset_settings"],
                    "settings": settings,
                    "measured": summary.get("measured", old.get("measured")),
                    "reference": _reference(entry),
                }
    return None


def run_suite(
    name: str,
    runs_dir: str,
    docs: str,
    max_minutes: float | None = None,
    purejaxrl: str | None = None,
    python: str = sys.executable,
    only: list[str] | None = None,
) -> int:
    """Runs (or continues) suite ``name``, records its numbers and rewrites the page; the exit code.

    ``only``: the names of the entries to train (default all); the others keep the numbers recorded earlier.
    An entry whose runs are not here (or not finished) also keeps its recorded numbers until its runs finish.
    """
    suite, deadline = SUITES[name], time.time() + (max_minutes * 60 if max_minutes else 1e9)
    data_path = os.path.join(docs, "results", f"{name}.json")
    old = json.load(open(data_path)) if os.path.exists(data_path) else {}
    os.makedirs(os.path.dirname(data_path), exist_ok=True)
    code, summaries = 0, []
    for entry in suite.entries:
        runs = [(os.path.join(runs_dir, name, run_name), seed) for run_name, seed in entry.run_names()]
        try:
            for run_dir, seed in runs if code == 0 and (only is None or entry.name in only) else []:
                if not run_to_end(entry, seed, run_dir, deadline):
                    code = _stopped(max_minutes)
                    break
        except KeyboardInterrupt as interrupt:
            code = _interrupted(interrupt)
        finished = all(_run_state(run_dir)["finished"] for run_dir, _ in runs)
        summaries.append(summarise(entry, [run_dir for run_dir, _ in runs]) if finished else _recorded(entry, old))
    peers = old.get("peers", {})
    try:
        for entry in suite.entries if purejaxrl and code == 0 else []:
            done = peers.get(entry.env, {})
            if not entry.purejaxrl or (done.get("seeds"), done.get("steps")) == (entry.seeds, entry.steps):
                continue  # a peer run at this budget is reused, as finished podracer runs are
            if time.time() > deadline:
                code = _stopped(max_minutes)
                break
            peers[entry.env] = run_peer(entry, purejaxrl, python)
    except KeyboardInterrupt as interrupt:
        code = _interrupted(interrupt)
    data = {"measured": _machine(), "names": [e.name for e in suite.entries], "entries": summaries, "peers": peers}
    with open(data_path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"results: wrote {write_page(docs)} and {data_path}", flush=True)
    return code


def refresh_recorded(name: str, docs: str) -> None:
    """Suite ``name``'s recorded numbers under its definitions of today: an entry the suite dropped leaves the
    page, one whose runs would differ (steps, seeds, the settings its preset and flags give) shows as not finished,
    a corrected reference applies."""
    data_path = os.path.join(docs, "results", f"{name}.json")
    if not os.path.exists(data_path):
        return
    old = json.load(open(data_path))
    entries = SUITES[name].entries
    data = {**old, "names": [e.name for e in entries], "entries": [_recorded(e, old) for e in entries]}
    with open(data_path, "w") as f:
        json.dump(data, f, indent=1)


def _machine() -> str:
    import platform

    import jax

    cores = os.cpu_count()
    return (
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()} with {cores} cores, "
        f"jax {jax.__version__} ({jax.default_backend()})"
    )


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), help="the suite to run (see experiments/suites.py)")
    parser.add_argument(
        "--runs-dir",
        default=os.path.join(ROOT, "runs", "results"),
        help="where the runs go (RUNS_DIR/<suite>/<run>); default runs/results",
    )
    parser.add_argument("--docs", default=os.path.join(ROOT, "docs"), help="where results.md and results/ go")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop the suite (resumably, the current run checkpointed) after this many minutes",
    )
    parser.add_argument(
        "--purejaxrl", metavar="DIR", help="a checkout of luchris429/purejaxrl: train its PPO alongside"
    )
    parser.add_argument(
        "--purejaxrl-python",
        metavar="PY",
        default=sys.executable,
        help="the Python that runs PureJaxRL (jax, flax, optax, distrax, gymnax<1.0)",
    )
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the recorded numbers")
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        help="train only this entry of the suite (repeatable; names as in its run directories, e.g. "
        "sebulba-impala-pong-v5-4mb); the others keep their recorded numbers",
    )
    args = parser.parse_args(argv)
    if args.page_only:
        for name in SUITES:
            refresh_recorded(name, args.docs)
        print(f"results: wrote {write_page(args.docs)}")
        return 0
    if args.suite is None:
        parser.error("--suite is required (or --page-only)")
    names = [entry.name for entry in SUITES[args.suite].entries]
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        parser.error(
            f"--only {', '.join(unknown)}: not an entry of suite {args.suite} (its entries: {', '.join(names)})"
        )
    if args.max_minutes is not None and args.max_minutes <= 0:
        parser.error(f"--max-minutes must be positive, got {args.max_minutes}")
    if args.purejaxrl and not os.path.isfile(os.path.join(args.purejaxrl, "purejaxrl", "ppo.py")):
        parser.error(f"--purejaxrl {args.purejaxrl}: no purejaxrl/ppo.py there (a checkout of luchris429/purejaxrl)")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops a suite as Ctrl-C does
    try:
        return run_suite(
            args.suite, args.runs_dir, args.docs, args.max_minutes, args.purejaxrl, args.purejaxrl_python, args.only
        )
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
