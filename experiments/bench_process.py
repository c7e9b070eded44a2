"""Benchmark plumbing: each measurement runs in a fresh process and reports one ``BENCH {...}`` JSON line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags every benchmark script takes: ``--quick``, ``--out``, and the hidden ``--worker``."""
    result = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--quick", action="store_true", help="fewer configurations")
    result.add_argument("--out", default="docs/benchmarks.md", help="markdown report to append to ('' for none)")
    result.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return result


def measure(script: str, kind: str, devices: int = 2, **spec) -> dict:
    """Runs ``script --worker '{"kind": kind, **spec}'`` with ``devices`` simulated CPU devices; its BENCH dict."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    command = [sys.executable, os.path.abspath(script), "--worker", json.dumps({"kind": kind, **spec})]
    out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "XLA_FLAGS": flags}, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            print(line, flush=True)
            return json.loads(line[len("BENCH "):])
    raise RuntimeError(f"{kind} {spec} failed:\n{out.stderr[-3000:]}")


def serve(spec_json: str, measurements: dict[str, Callable[..., dict]]) -> None:
    """The worker side: runs the measurement ``spec_json`` names and prints its BENCH line."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)  # as `podracer sebulba` runs
    spec = json.loads(spec_json)
    result = measurements[spec.pop("kind")](**spec)
    print("BENCH " + json.dumps({**json.loads(spec_json), **result}), flush=True)


def report(lines: list[str], out: str) -> None:
    """Prints the markdown ``lines`` and appends them to ``out`` (unless it is empty)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text)
