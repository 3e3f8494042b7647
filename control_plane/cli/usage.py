"""``sluice usage``: every tenant's requests, errors, tokens and cost per model and request class over a
window, through the admin API (``GET /admin/v1/usage``, viewer). A table with a totals line by default,
the API's JSON with ``--json``; exit codes as in ``control_plane.cli.admin_commands``.

``--since`` / ``--until`` take an ISO 8601 time, unix seconds or a duration ago (``24h``, ``7d``); the
default is the last 24 h. They are checked here with the service's own parser
(sluice/stores/ledger/window.py), so a bad one is a usage error (exit 2) before any call, and sent as written:
the service resolves a duration against its clock.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from control_plane.cli.admin_client import AdminApi
from control_plane.cli.admin_commands import EXIT_OK, UsageError, add_options, print_json, when
from control_plane.table import render_table
from sluice.domain import RequestClass
from sluice.stores.ledger.window import WindowError, report_window

HEADERS = (
    "TENANT",
    "MODEL",
    "CLASS",
    "REQUESTS",
    "PROMPT_TOKENS",
    "OUTPUT_TOKENS",
    "ERRORS",
    "COST_USD",
)
TOTAL = "TOTAL"


def usd(cost: float | None) -> str:
    """A cost as one cell: to the micro-dollar (the JSON has the exact float); ``-`` when not priced."""
    return "-" if cost is None else f"{cost:.6f}"


def report_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per (tenant, model, class), then the totals line."""
    rows = [
        [
            line["tenant_id"],
            line["model"],
            line["request_class"],
            str(line["num_requests"]),
            str(line["prompt_tokens"]),
            str(line["output_tokens"]),
            str(line["num_errors"]),
            usd(line["cost_usd"]),
        ]
        for line in report["data"]
    ]
    t = report["totals"]
    totals = [str(t["num_requests"]), str(t["prompt_tokens"]), str(t["output_tokens"]), str(t["num_errors"])]
    return [*rows, [TOTAL, "-", "-", *totals, usd(t["cost_usd"])]]


def print_report(report: dict[str, Any]) -> None:
    print(f"Usage from {when(report['since'])} to {when(report['until'])}")
    if not report["data"]:
        print("No usage in this window.")
        return
    print(render_table(HEADERS, report_rows(report)))
    if report["totals"]["cost_usd"] is None and any(line["cost_usd"] is not None for line in report["data"]):
        print("(no total cost: some models have no price in SLUICE_PRICES)")


def _usage(api: AdminApi, args: argparse.Namespace) -> int:
    try:
        report_window(args.since, args.until, now=datetime.now(UTC))
    except WindowError as exc:
        raise UsageError(f"--{exc.param}: {exc}") from None
    report = api.call(
        "GET",
        "/usage",
        since=args.since,
        until=args.until,
        tenant=args.tenant,
        model=args.model,
        request_class=args.request_class,
    )
    if args.json:
        print_json(report)
    else:
        print_report(report)
    return EXIT_OK


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``sluice usage``'s options to ``parser``."""
    window = "an ISO 8601 time, unix seconds, or a duration ago (90m, 24h, 7d)"
    parser.add_argument("--since", metavar="WHEN", help=f"from (default: 24h before --until); {window}")
    parser.add_argument("--until", metavar="WHEN", help=f"up to, not including (default: now); {window}")
    parser.add_argument("--tenant", metavar="T", help="only this tenant (its id)")
    parser.add_argument("--model", metavar="M", help="only this model")
    parser.add_argument(
        "--class",
        dest="request_class",
        choices=[c.value for c in RequestClass],
        help="only this request class",
    )
    add_options(parser, _usage)
