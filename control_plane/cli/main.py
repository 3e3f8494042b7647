"""The ``sluice`` command: one top-level parser, with each command group registered in ``COMMAND_GROUPS``.

To add a group (``sluice sim ...``), write a module with ``register(parser)`` that adds its subcommands
to ``parser``, each with ``set_defaults(handler=...)`` (a function of the parsed arguments returning the
exit code), and add one line to ``COMMAND_GROUPS``.

Exit codes: 0 done; 1 the command ran and failed (not found, already exists, storage unreachable);
2 a usage error (a bad option or value). Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from control_plane.cli import admin_tokens, models, replicas, rollout, routes, tenants, top, usage, versions
from control_plane.cli.build_engine import register as register_build_engine
from control_plane.cli.trtllm_smoke import register as register_trtllm_smoke
from control_plane.sim import cli as sim

EXIT_FAILED = 1
EXIT_USAGE = 2

Register = Callable[[argparse.ArgumentParser], None]

# (name, one-line help, register): the registration point for every command group.
COMMAND_GROUPS: list[tuple[str, str, Register]] = [
    ("tenants", "create, list, change tenants and rotate their API keys", tenants.register),
    ("admin-tokens", "create, list and revoke the control plane's admin tokens", admin_tokens.register),
    ("models", "list, show and create the registry's models (admin API)", models.register),
    ("versions", "list, add and set the state of a model's versions (admin API)", versions.register),
    ("routes", "show and set a model's split over its versions (admin API)", routes.register),
    (
        "rollout",
        "start, advance, pause, resume, roll back and compare a rollout (admin API)",
        rollout.register,
    ),
    (
        "replicas",
        "start, list, drain and stop the replicas serving the versions (admin API)",
        replicas.register,
    ),
    ("build-engine", "build a stored checkpoint into a staged version (cpu, trtllm*)", register_build_engine),
    (
        "trtllm-smoke",
        "on a first GPU node: build, serve and check a TensorRT-LLM engine through a gateway",
        register_trtllm_smoke,
    ),
    ("usage", "every tenant's requests, tokens, errors and cost over a window (admin API)", usage.register),
    ("top", "a live view of each model version and replica: load, latency, tokens/s, health", top.register),
    ("sim", "simulate the fleet at the seed's scale with the real scheduling policies", sim.register),
]


class CliParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: message (see prog --help)``), exit 2.
    Subparsers are made with the same class, so every level behaves alike."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> CliParser:
    parser = CliParser(
        prog="sluice", description="Operate Sluice: tenants and their API keys; the fleet simulator."
    )
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    for name, help_text, register in COMMAND_GROUPS:
        group = groups.add_parser(name, help=help_text, description=help_text)
        register(group)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (the ``sluice`` script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler
    # NOTE: the pool logs each failed connection attempt (multi-line); the command says it once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # NOTE: the last net: an operator gets what failed in one line, not a traceback.
        print(f"sluice: error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
