"""``sluice sim``: run a fleet scenario, write ``<out>/<scenario>.json`` and ``<out>/<scenario>.png``.

``register(parser)`` adds it to the ``sluice`` CLI; ``python -m control_plane.sim.cli``
runs it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from control_plane.sim.scenarios import SCENARIOS, Options, run_scenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--replicas", type=int, default=None, help="fleet size (default: searched)")
    parser.add_argument(
        "--find-replicas",
        action="store_true",
        help="steady: search the fewest replicas meeting TTFT p95 < 500 ms and ITL p95 < 40 ms",
    )
    parser.add_argument("--duration-s", type=float, default=120.0, help="simulated seconds of arrivals")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(".sluice/sim"))
    parser.add_argument("--json", action="store_true", help="print the summary JSON")


def register(parser: argparse.ArgumentParser) -> None:
    """Add the options under ``parser`` (``sluice sim``; see control_plane/cli/main.py)."""
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.replicas is not None and args.replicas < 1:
        print("--replicas must be >= 1", file=sys.stderr)
        return 2
    if args.duration_s <= 0:
        print("--duration-s must be > 0", file=sys.stderr)
        return 2
    options = Options(
        replicas=args.replicas,
        find_replicas=args.find_replicas,
        duration_s=args.duration_s,
        seed=args.seed,
    )
    started = time.monotonic()
    summary = run_scenario(args.scenario, options, args.out)
    if args.json:
        summary = {k: v for k, v in summary.items() if k != "definitions"}
        print(json.dumps(summary, indent=2, sort_keys=True))
    elapsed_s = time.monotonic() - started
    print(f"wrote {args.out / args.scenario}.json and .png in {elapsed_s:.1f} s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluice sim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
