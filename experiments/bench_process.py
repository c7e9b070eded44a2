"""Benchmark plumbing: each measurement runs in a fresh process and reports one ``BENCH {...}`` JSON line."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable

from podracer.evaluation import OFF

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_EVALUATION = OFF  # benchmarks time training; a final evaluation only adds wall time


ACCELERATOR_HELP = (
    "on a GPU or TPU host: accelerator-sized batches on its own devices; the tables go to "
    "sections of their own ('... on an accelerator'), beside the CPU ones"
)


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags every benchmark script takes: ``--quick``, ``--out``, ``--accelerator`` and the hidden ``--worker``."""
    result = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--quick", action="store_true", help="fewer configurations")
    result.add_argument(
        "--out", default="docs/benchmarks.md", help="markdown file to write this benchmark's section into ('' for none)"
    )
    result.add_argument("--accelerator", action="store_true", help=ACCELERATOR_HELP)
    result.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return result


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def heading(title: str, accelerator: bool) -> str:
    """The report's top-level heading: accelerator tables live beside the CPU ones, not over them."""
    return f"# {title} on an accelerator" if accelerator else f"# {title}"


def worker_env(devices: int | None) -> dict:
    """The environment of a measurement process: ``devices`` simulated CPU devices, or (None) the host's own."""
    if devices is None:
        return {**os.environ, "PODRACER_BENCH_ACCELERATOR": "1"}
    return {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}",
    }


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
        raise SystemExit(
            "--accelerator: JAX found no GPU or TPU on this host (its backend is cpu); "
            "run without --accelerator for the CPU tables"
        )


def measure(script: str, kind: str, devices: int | None = 2, **spec) -> dict:
    """Runs ``script --worker '{"kind": kind, **spec}'`` with ``devices`` simulated CPU devices (None: the host's
    own devices, for ``--accelerator``); its BENCH dict."""
    command = [sys.executable, os.path.abspath(script), "--worker", json.dumps({"kind": kind, **spec})]
    out = subprocess.run(command, capture_output=True, text=True, env=worker_env(devices), cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            print(line, flush=True)
            return json.loads(line[len("BENCH ") :])
    raise RuntimeError(f"{kind} {spec} failed:\n{out.stderr[-3000:]}")


def serve(spec_json: str, measurements: dict[str, Callable[..., dict]]) -> None:
    """The worker side: runs the measurement ``spec_json`` names and prints its BENCH line."""
    from podracer.sebulba import prefer_synchronous_cpu_dispatch

    prefer_synchronous_cpu_dispatch()  # before JAX starts, as `podracer` runs
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


XPROF_FLAG = "--xla_cpu_enable_xprof_traceme=true"  # XLA:CPU names each kernel it runs in a profiler trace


def enable_kernel_traces() -> None:
    """Before JAX starts: XLA:CPU is to record every kernel it runs in a profiler trace (see :func:`kernel_times`)."""
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XPROF_FLAG}"


_MULTIPLIES = re.compile(r" (dot|convolution)\(")
_NO_KERNEL = re.compile(r" (parameter|get-tuple-element|bitcast|constant|tuple|while|call|conditional)\(")


def hlo_kernels(hlo_text: str) -> tuple[set[str], set[str]]:
    """Names of a compiled HLO module's instructions that may run as XLA:CPU kernels (not loops and calls, whose
    bodies' kernels are named on their own), and those of them that multiply matrices: dots, convolutions and
    the fusions that hold one."""
    bodies, name = {}, None
    for line in hlo_text.splitlines():
        if line and not line.startswith((" ", "}")):
            name = line.split(" ", 1)[0].lstrip("%")
            bodies[name] = []
        elif name and " = " in line:
            bodies[name].append(line)
    multiplying = {c for c, body in bodies.items() if any(_MULTIPLIES.search(line) for line in body)}
    kernels, matmuls = set(), set()
    for body in bodies.values():  # names inside fusions and reducers never name a kernel: harmless here
        for line in body:
            if _NO_KERNEL.search(line):
                continue
            instruction = line.split(" = ", 1)[0].strip().removeprefix("ROOT ").lstrip("%")
            kernels.add(instruction)
            called = re.search(r"calls=%([\w.-]+)", line)
            if _MULTIPLIES.search(line) or (called and called[1] in multiplying):
                matmuls.add(instruction)
    return kernels, matmuls


def kernel_times(fn, args: tuple, calls: int) -> dict | None:
    """What a call of the jitted ``fn(*args)`` spends in XLA:CPU kernels, averaged over ``calls`` traced calls:
    ``matmul_us``/``matmul_kernels`` (dots, convolutions and the fusions that hold one) and ``other_us``/
    ``other_kernels`` (every other kernel it runs). Tracing adds a little to each kernel.

    None where the trace names no kernel of ``fn`` (another backend, or :func:`enable_kernel_traces` not called
    before JAX started)."""
    import gzip
    import tempfile

    import jax

    kernels, matmuls = hlo_kernels(fn.lower(*args).compile().as_text())
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as trace_dir:
        options = jax.profiler.ProfileOptions()
        options.host_tracer_level = 3
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True, profiler_options=options)
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        jax.profiler.stop_trace()
        traces = [
            os.path.join(d, f) for d, _, files in os.walk(trace_dir) for f in files if f == "perfetto_trace.json.gz"
        ]
        events = json.load(gzip.open(traces[0])) if traces else []
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    totals = {"matmul_us": 0.0, "matmul_kernels": 0, "other_us": 0.0, "other_kernels": 0}
    for event in events:
        if event.get("ph") == "X" and event.get("name") in kernels:
            kind = "matmul" if event["name"] in matmuls else "other"
            totals[f"{kind}_us"] += event["dur"]
            totals[f"{kind}_kernels"] += 1
    if not totals["matmul_kernels"] + totals["other_kernels"]:
        return None
    return {key: value / calls for key, value in totals.items()}
