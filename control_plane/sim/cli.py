"""``sluice sim``: run a fleet scenario, write ``<out>/<scenario>.json`` and ``<out>/<scenario>.png``.

While it runs, progress lines go to stderr (``progress.py``; ``--quiet`` turns them off; they are printed
whether or not stderr is a terminal, one line each, so a log shows them too). At the end, stdout gets the
summary table and the targets table (``terminal.py``), then where the files went; with ``--json``, stdout
gets the same figures as one JSON object instead, and where the files went goes to stderr.

``register(parser)`` adds it to the ``sluice`` CLI; ``python -m control_plane.sim.cli``
runs it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from control_plane.sim import terminal
from control_plane.sim.progress import ProgressLines
from control_plane.sim.scenarios import SCENARIOS, Options, run_scenario
from control_plane.sim.workload import SEED_RATE_PER_S


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--replicas", type=int, default=None, help="fleet size (default: searched)")
    parser.add_argument(
        "--find-replicas",
        action="store_true",
        help="steady: search the fewest replicas meeting TTFT p95 < 500 ms and ITL p95 < 40 ms",
    )
    parser.add_argument("--duration-s", type=float, default=120.0, help="simulated seconds of arrivals")
    parser.add_argument(
        "--rate-per-s",
        type=float,
        default=SEED_RATE_PER_S,
        help="interactive arrivals per second (default: the seed's peak, 280); batch-fill sizes its own",
    )
    parser.add_argument(
        "--cold-start-s",
        type=float,
        default=120.0,
        help="doubling: seconds a replica the autoscaler starts takes to be routed (default 120)",
    )
    parser.add_argument(
        "--warm-pool",
        type=int,
        default=None,
        help="doubling: warm replicas of the warm-pool run (default: as many as the fleet)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(".sluice/sim"))
    parser.add_argument("--json", action="store_true", help="print the table's figures as JSON instead")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def register(parser: argparse.ArgumentParser) -> None:
    """Add the options under ``parser`` (``sluice sim``; see control_plane/cli/main.py)."""
    add_arguments(parser)
    parser.set_defaults(handler=run)


def _invalid(args: argparse.Namespace) -> str | None:
    if args.replicas is not None and args.replicas < 1:
        return "--replicas must be >= 1"
    if args.duration_s <= 0:
        return "--duration-s must be > 0"
    if args.rate_per_s <= 0:
        return "--rate-per-s must be > 0"
    if args.cold_start_s < 0:
        return "--cold-start-s must be >= 0"
    if args.warm_pool is not None and args.warm_pool < 0:
        return "--warm-pool must be >= 0"
    return None


def run(args: argparse.Namespace) -> int:
    if (problem := _invalid(args)) is not None:
        print(problem, file=sys.stderr)
        return 2
    options = Options(
        replicas=args.replicas,
        find_replicas=args.find_replicas,
        duration_s=args.duration_s,
        seed=args.seed,
        rate_per_s=args.rate_per_s,
        cold_start_s=args.cold_start_s,
        warm_pool_replicas=args.warm_pool,
        progress=None if args.quiet else ProgressLines(sys.stderr, args.scenario),
    )
    started = time.monotonic()
    summary = run_scenario(args.scenario, options, args.out)
    elapsed_s = time.monotonic() - started
    files = [str(args.out / f"{args.scenario}.json"), str(args.out / f"{args.scenario}.png")]
    wrote = f"wrote {files[0]} and {files[1]} in {elapsed_s:.1f} s"
    if args.json:
        print(json.dumps(terminal.as_json(summary, files), indent=2, sort_keys=True))
        print(wrote, file=sys.stderr)
    else:
        print(terminal.render(summary))
        print(f"\n{wrote}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluice sim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
