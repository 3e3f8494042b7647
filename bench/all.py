"""``make bench``: every benchmark in bench/ (and the simulator's scenarios), one after another, then the
overview at the top of docs/benchmarks.md (bench/overview.py).

Each benchmark runs as its own process (``python -m MODULE ARGS``) with a progress line before and after;
its output passes through. One that fails is reported as failed in the overview and the run goes on; the
exit status is nonzero if any failed. Benchmarks that measure a running stack (``needs_stack``) share one
that this runner starts (``python -m gateway.devstack``, as ``make run``) on free ports with a state
directory of its own, so a developer's ``make run`` is neither used nor disturbed.

    .venv/bin/python -m bench.all [--only NAME ...] [--list]     # make bench [BENCH_ONLY=NAME]
    BENCH_QUICK=1 .venv/bin/python -m bench.all                    # reduced sizes: smoke, docs untouched

Full sizes write each benchmark's section (``--write-docs``), plots under docs/img/ and the overview; quick
sizes (a smoke run: does every benchmark still run?) write nothing into docs/, only a summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench import overview
from bench.report import DOCS, load_average
from bench.servers import REPO_ROOT, SluiceStack, StackPorts, log

CHECKPOINT = ".sluice/models/sluice-tiny"
STACK_DIR = REPO_ROOT / ".sluice" / "bench" / "all"
RUNS = REPO_ROOT / "docs" / "img" / "bench-runs.json"
SIM_SCENARIOS = ("steady", "doubling", "noisy-tenant", "batch-fill")


@dataclass(frozen=True)
class Bench:
    """One benchmark: its module, its arguments at full and at quick size (``{base_url}``, ``{grpc_url}``,
    ``{metrics_url}``, ``{telemetry}`` and ``{sim_out}`` are filled in), and its expected minutes at full
    size on a 2-core machine."""

    name: str
    module: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    minutes: float
    needs_stack: bool = False  # measures the runner's stack (fills {base_url} and the rest)


_STACK_URL = ("--base-url", "{base_url}")
_SIM = ("--replicas", "56", "--out", "{sim_out}", "-q")
_SIM_QUICK = ("--replicas", "4", "--duration-s", "30", "--rate-per-s", "20", "--out", "{sim_out}", "-q")

BENCHES: tuple[Bench, ...] = (
    Bench("engine", "bench.engine_bench", ("--model", CHECKPOINT, "--write-docs"),
          ("--model", CHECKPOINT, "--concurrency", "1", "8", "--requests-per-slot", "1", "--dtype", "auto"),
          4),
    Bench("attention", "bench.attention_bench", (), ("--repeats", "20"), 1),
    Bench("linear", "bench.linear_bench", (), ("--rounds", "1", "--only", "shapes", "--no-torch"), 3),
    Bench("grammar-choice", "bench.grammar_choice", ("--model", CHECKPOINT, "--write-docs"),
          ("--model", CHECKPOINT, "--repeats", "2", "--steps", "50"), 1),
    Bench("features", "bench.features_bench", ("--model", CHECKPOINT, "--write-docs"),
          ("--model", CHECKPOINT, "--requests", "32", "--rounds", "1", "--output-len", "32"), 3),
    Bench("safety", "bench.safety_bench", ("--write-docs",), ("--repeat", "1"), 1),
    Bench("replica", "bench.replica_bench", ("--checkpoint-dir", CHECKPOINT),
          ("--checkpoint-dir", CHECKPOINT, "--concurrency", "8", "--requests", "16"), 2),
    Bench("cancel-to-free", "bench.cancel_bench", ("--streams", "50", "--write-docs"), ("--streams", "5"), 1),
    Bench("e2e", "bench.e2e_bench", ("--base-url", "{base_url}/v1", "--concurrency", "1", "8", "32"),
          ("--base-url", "{base_url}/v1", "--concurrency", "8", "--requests-per-slot", "1"), 2, True),
    Bench("gateway-overhead", "bench.gateway_overhead",
          (*_STACK_URL, "--grpc-url", "{grpc_url}", "--write-docs"),
          (*_STACK_URL, "--grpc-url", "{grpc_url}", "--requests", "30"), 2, True),
    Bench("hostile-input", "bench.hostile_bench", (*_STACK_URL, "--write-docs"),
          (*_STACK_URL, "--rounds", "1", "--kinds", "forged"), 4, True),
    Bench("noisy-tenant", "bench.noisy_tenant_bench",
          (*_STACK_URL, "--telemetry", "{telemetry}", "--write-docs"),
          (*_STACK_URL, "--telemetry", "{telemetry}", "--flood-streams", "40", "--duration-s", "4",
           "--warmup-s", "2"), 1, True),
    Bench("batch-yield", "bench.batch_yield", (*_STACK_URL, "--write-docs"),
          (*_STACK_URL, "--duration-s", "4", "--lines", "20"), 2, True),
    Bench("upload-memory", "bench.upload_memory", ("--write-docs",),
          ("--size-mib", "8", "--uploads", "2", "--rounds", "1"), 1),
    Bench("registry-propagation", "bench.registry_propagation", ("--write-docs",), ("--changes", "5"), 1),
    Bench("placement", "bench.placement_bench", ("--write-docs",),
          ("--rounds", "1", "--requests", "32", "--placements", "score,random"), 8),
    Bench("long-prompt-pool", "bench.long_prompt_pool", ("--write-docs",),
          ("--rounds", "1", "--duration-s", "5"), 6),
    Bench("e2e-vs-vllm", "bench.e2e_side_by_side",
          ("--model", CHECKPOINT, "--model-repository", ".sluice/model_repository", "--concurrency", "1", "4",
           "16", "32", "--rounds", "2", "--section", "e2e-vs-vllm-sweep", "--write-docs"),
          ("--model", CHECKPOINT, "--model-repository", ".sluice/model_repository", "--concurrency", "1", "8",
           "--rounds", "1", "--requests-per-slot", "1"), 8),
    Bench("gateway-capacity", "bench.gateway_capacity", ("--write-docs",),
          ("--streams", "50", "--window-s", "5"), 6),
    Bench("gateway-hot-path", "bench.gateway_hot_path", ("--write-docs",), ("--repeat", "1"), 1),
    Bench("grpc-client", "bench.grpc_client", ("--write-docs",),
          ("--rounds", "1", "--requests", "200", "--streams", "20"), 3),
    Bench("goodput", "bench.goodput",
          ("--model", CHECKPOINT, "--model-repository", ".sluice/model_repository", "--write-docs"),
          ("--model", CHECKPOINT, "--model-repository", ".sluice/model_repository", "--quick"), 15),
    # The seed's own mix (1,000-token prompts, 300 output tokens): fewer points, a request is ~10x longer.
    Bench("goodput-seed-mix", "bench.goodput",
          ("--model", CHECKPOINT, "--model-repository", ".sluice/model_repository", "--mix", "seed",
           "--concurrency", "1", "8", "16", "32", "--rates", "1", "2", "4", "--rounds", "1", "--write-docs"),
          ("--model", CHECKPOINT, "--model-repository", ".sluice/model_repository", "--mix", "seed",
           "--quick"), 12),
    *(Bench(f"sim-{s}", "control_plane.sim.cli", ("--scenario", s, *_SIM), ("--scenario", s, *_SIM_QUICK),
            9 if s == "doubling" else 1.5) for s in SIM_SCENARIOS),
)  # fmt: skip


def unlisted(bench_dir: Path = REPO_ROOT / "bench", benches: Sequence[Bench] = BENCHES) -> list[str]:
    """The modules in ``bench_dir`` with a ``main`` that no entry runs (this runner excepted): a new
    benchmark must be added to ``BENCHES``."""
    # NOTE: bench.fake_replica is a server the capacity benchmark starts, not a benchmark; bench.stack_ab
    # is a tool run by hand (it compares repositories rendered for the question at hand, on make run's ports).
    listed = {b.module for b in benches} | {__name__, "bench.all", "bench.fake_replica", "bench.stack_ab"}
    with_main = [f"bench.{path.stem}" for path in sorted(bench_dir.glob("*.py"))
                 if re.search(r"^def main\(", path.read_text(), re.M)]  # fmt: skip
    return [module for module in with_main if module not in listed]


def command_of(bench: Bench, quick: bool, values: Mapping[str, str]) -> list[str]:
    """The argv that runs ``bench`` at the chosen size, placeholders filled from ``values``."""
    args = bench.quick if quick else bench.full
    return [sys.executable, "-m", bench.module, *(a.format(**values) for a in args)]


@contextmanager
def shared_stack(needed: bool) -> Iterator[dict[str, str]]:
    """The placeholders' values; with ``needed``, a stack started for the benchmarks that measure one and
    stopped after them (whatever happens)."""
    values = {"sim_out": str(REPO_ROOT / ".sluice" / "bench" / "sim"), "base_url": "", "grpc_url": "",
              "metrics_url": "", "telemetry": ""}  # fmt: skip
    if not needed:
        yield values
        return
    ports = StackPorts.free()
    state = STACK_DIR / "state"
    stack = SluiceStack(REPO_ROOT / ".sluice" / "model_repository", "", STACK_DIR / "devstack.log",
                        state_dir=state, checkpoint_dir=REPO_ROOT / CHECKPOINT, ports=ports)  # fmt: skip
    stack.start()
    try:
        yield {**values, "base_url": ports.base_url, "grpc_url": ports.grpc_url,
               "metrics_url": ports.metrics_url, "telemetry": str(state / "telemetry.jsonl")}  # fmt: skip
    finally:
        stack.stop()


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime())


def run_one(bench: Bench, argv: list[str], index: int, total: int) -> overview.RunRecord:
    print(f"\n=== [{index}/{total}] {bench.name} (~{bench.minutes:g} min at full size): "
          f"{' '.join(argv[1:])}", flush=True)  # fmt: skip
    began = time.monotonic()
    rc = subprocess.run(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL).returncode
    minutes = (time.monotonic() - began) / 60
    status = "ok" if rc == 0 else f"failed (exit status {rc})"
    print(f"=== [{index}/{total}] {bench.name}: {status} in {minutes:.1f} min", flush=True)
    return overview.RunRecord(bench.name, status, minutes, _now())


def run_benches(selected: Sequence[Bench], quick: bool) -> list[overview.RunRecord]:
    """Each in order, except that those that measure the shared stack run last, together, under one
    stack; a benchmark the stack could not be started for is recorded as failed."""
    on_stack = [b for b in selected if b.needs_stack]
    alone = [b for b in selected if not b.needs_stack]
    records: list[overview.RunRecord] = []
    for group, needs_stack in ((alone, False), (on_stack, True)):
        if not group:
            continue
        try:
            with shared_stack(needs_stack) as values:
                for bench in group:
                    argv = command_of(bench, quick, values)
                    records.append(run_one(bench, argv, len(records) + 1, len(selected)))
        except RuntimeError as exc:  # the stack did not start (a benchmark's failure is an exit status)
            log(f"the shared stack failed: {exc}")
            done = {r.name for r in records}
            records += [overview.RunRecord(b.name, "failed (the stack did not start)", 0.0, _now())
                        for b in group if b.name not in done]  # fmt: skip
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=[b.name for b in BENCHES])
    ap.add_argument("--list", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--overview-only", action="store_true", help="rewrite the overview from the last runs")
    args = ap.parse_args(argv)
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    selected = [b for b in BENCHES if args.only is None or b.name in args.only]
    if args.list:
        for b in selected:
            print(f"{b.name:22} ~{b.minutes:>4g} min  python -m {b.module} "
                  f"{' '.join(b.quick if quick else b.full)}")  # fmt: skip
        return 0
    print(f"{len(selected)} benchmarks, {'quick' if quick else 'full'} sizes, ~"
          f"{sum(b.minutes for b in selected):.0f} min expected at full size", flush=True)  # fmt: skip
    records = [] if args.overview_only else run_benches(selected, quick)
    failed = [r.name for r in records if r.status != "ok"]
    summary = f"{len(records) - len(failed)} of {len(records)} benchmarks ok"
    summary += f"; failed: {failed}" if failed else ""
    if quick:
        print("\n" + "\n".join(f"{r.name:22} {r.status} in {r.minutes:.1f} min" for r in records))
        print(f"\n{summary}; quick sizes: nothing written into docs/")
        return 1 if failed else 0
    publish_sim(records)
    runs = {**overview.load_runs(RUNS), **{r.name: r for r in records}}
    overview.save_runs(RUNS, runs)
    command = "make bench" + (f" BENCH_ONLY='{' '.join(args.only)}'" if args.only else "")
    load = f"{load_average()} at the end"
    if args.overview_only:
        command = ".venv/bin/python -m bench.all --overview-only"
        load = "each run's load average is beside its figures in its section"
    body = overview.overview(runs, [b.name for b in BENCHES], command, load, DOCS.parent)
    overview.write_overview(body, DOCS)
    print(f"\n{summary}; overview written to {DOCS}")
    return 1 if failed else 0


def publish_sim(records: Sequence[overview.RunRecord]) -> None:
    """The simulator's figures and summaries of the scenarios that ran, into docs/img/sim/."""
    source, target = REPO_ROOT / ".sluice" / "bench" / "sim", REPO_ROOT / "docs" / "img" / "sim"
    for record in records:
        scenario = record.name.removeprefix("sim-")
        if record.name.startswith("sim-") and record.status == "ok":
            target.mkdir(parents=True, exist_ok=True)
            for suffix in (".png", ".json"):
                (target / f"{scenario}{suffix}").write_bytes((source / f"{scenario}{suffix}").read_bytes())


if __name__ == "__main__":
    sys.exit(main())
