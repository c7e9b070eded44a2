"""Benchmark plumbing: each measurement runs in a fresh process and reports one ``BENCH {...}`` JSON line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Callable

from podracer.evaluation import OFF

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_EVALUATION = OFF  # benchmarks time training; a final evaluation only adds wall time


ACCELERATOR_HELP = ("on a GPU or TPU host: accelerator-sized batches on its own devices; the tables go to "
                    "sections of their own ('... on an accelerator'), beside the CPU ones")


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags every benchmark script takes: ``--quick``, ``--out``, ``--accelerator`` and the hidden ``--worker``."""
    result = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--quick", action="store_true", help="fewer configurations")
    result.add_argument("--out", default="docs/benchmarks.md", help="markdown file to write this benchmark's section into ('' for none)")
    result.add_argument("--accelerator", action="store_true", help=ACCELERATOR_HELP)
    result.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return result


def heading(title: str, accelerator: bool) -> str:
    """The report's top-level heading: accelerator tables live beside the CPU ones, not over them."""
    return f"# {title} on an accelerator" if accelerator else f"# {title}"


def worker_env(devices: int | None) -> dict:
    """The environment of a measurement process: ``devices`` simulated CPU devices, or (None) the host's own."""
    if devices is None:
        return {**os.environ, "PODRACER_BENCH_ACCELERATOR": "1"}
    return {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"}


def refuse_cpu_only_host(parser: argparse.ArgumentParser) -> None:
    """For ``--accelerator``: a one-line error (exit 2) before any measurement if JAX sees no GPU or TPU.

    Asked in a child process, so that this one never holds the accelerator its measurements need."""
    probe = "import jax; print(jax.default_backend())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=worker_env(None))
    if out.returncode or out.stdout.strip() == "cpu":
        parser.error("--accelerator: JAX sees no GPU or TPU on this host; run without it for the CPU tables")


def check_accelerator() -> None:
    """In a measurement process of an ``--accelerator`` run: stop unless JAX found a GPU or TPU."""
    import jax

    if os.environ.get("PODRACER_BENCH_ACCELERATOR") and jax.default_backend() == "cpu":
        raise SystemExit("--accelerator: JAX found no GPU or TPU on this host (its backend is cpu); "
                         "run without --accelerator for the CPU tables")


def measure(script: str, kind: str, devices: int | None = 2, **spec) -> dict:
    """Runs ``script --worker '{"kind": kind, **spec}'`` with ``devices`` simulated CPU devices (None: the host's
    own devices, for ``--accelerator``); its BENCH dict."""
    command = [sys.executable, os.path.abspath(script), "--worker", json.dumps({"kind": kind, **spec})]
    out = subprocess.run(command, capture_output=True, text=True, env=worker_env(devices), cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            print(line, flush=True)
            return json.loads(line[len("BENCH "):])
    raise RuntimeError(f"{kind} {spec} failed:\n{out.stderr[-3000:]}")


def serve(spec_json: str, measurements: dict[str, Callable[..., dict]]) -> None:
    """The worker side: runs the measurement ``spec_json`` names and prints its BENCH line."""
    import sebulba  # noqa: F401 - before JAX starts: its dispatch setting, as `podracer` runs
    check_accelerator()
    spec = json.loads(spec_json)
    result = measurements[spec.pop("kind")](**spec)
    print("BENCH " + json.dumps({**json.loads(spec_json), **result}), flush=True)


def report(lines: list[str], out: str) -> None:
    """Prints the markdown ``lines`` and writes them into ``out`` (unless it is empty).

    ``lines[0]`` is the report's top-level heading (``# ...``): a section of ``out``
    under the same heading, up to the next top-level heading, is replaced, so that
    re-running one benchmark keeps the others' sections; otherwise it is appended.
    """
    text = "\n".join(lines) + "\n"
    print(text)
    if not out:
        return
    old = open(out).read().splitlines(keepends=True) if os.path.exists(out) else []
    heading = lines[0].strip()
    starts = [i for i, line in enumerate(old) if line.strip() == heading]
    if starts:
        start = starts[0]
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("# ")), len(old))
        rest = "".join(old[end:])
        new = "".join(old[:start]) + text + ("\n" + rest if rest else "")
    else:
        new = "".join(old) + ("\n" if old else "") + text
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(new)
