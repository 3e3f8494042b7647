"""``sluice top``: a live view, per model, version and replica, of requests running and waiting, KV
occupancy, TTFT and inter-token p95, tokens/s and health.

Each refresh reads the control plane's replica list (``GET /admin/v1/replicas``, with ``--admin-url`` /
``--token`` as the other admin commands), scrapes every replica's metrics URL and every gateway's
``/metrics`` (``--gateway URL``, repeatable; default http://127.0.0.1:8080/metrics) at once, and redraws
the screen (plain ANSI: clear and redraw, so it works in any terminal). Rates and p95s cover the time since
the previous refresh (``top_view`` does the arithmetic). A source that cannot be read is named in the view,
which keeps refreshing. ``--once`` reads twice, ``--interval`` apart, prints that snapshot and exits;
``--json`` prints it as JSON.

Exit codes: 0 done, or the live view left with Ctrl-C (also when a source could not be read: the view
says which); 2 usage; 130 Ctrl-C during ``--once``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from control_plane.cli.admin_client import AdminApi, AdminApiError, add_connection_options
from control_plane.cli.admin_commands import EXIT_OK, EXIT_USAGE, fail
from control_plane.cli.top_render import as_json, render
from control_plane.cli.top_view import Scrape, Sources, Window, build_snapshot
from control_plane.metrics_text import Metrics
from sluice.settings import SettingsError, load_settings

DEFAULT_GATEWAY_METRICS_URL = "http://127.0.0.1:8080/metrics"
SCRAPE_TIMEOUT_S = 2.0
MAX_PARALLEL_SCRAPES = 16
CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase the screen


def scrape(client: httpx.Client, url: str) -> Scrape:
    """One GET of a metrics URL; what went wrong in words instead of an exception."""
    try:
        response = client.get(url)
        response.raise_for_status()
        metrics = Metrics.parse(response.text)
    except httpx.HTTPStatusError as exc:
        return Scrape(url, time.monotonic(), None, f"HTTP {exc.response.status_code}")
    except httpx.HTTPError as exc:
        reason = " ".join(str(exc).split()) or "no detail"
        return Scrape(url, time.monotonic(), None, f"unreachable ({type(exc).__name__}: {reason})")
    except ValueError as exc:
        return Scrape(url, time.monotonic(), None, str(exc))
    return Scrape(url, time.monotonic(), metrics)


class Reader:
    """Reads every source once per ``read()``, keeping the previous read of each URL so that each
    refresh's rates cover the time since the last."""

    def __init__(self, api: AdminApi, gateway_urls: list[str], model: str | None) -> None:
        self._api = api
        self._gateway_urls = gateway_urls
        self._model = model
        self._client = httpx.Client(timeout=SCRAPE_TIMEOUT_S)
        self._pool = ThreadPoolExecutor(MAX_PARALLEL_SCRAPES, thread_name_prefix="sluice-top")
        self._previous: dict[str, Scrape] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def read(self) -> Sources:
        replicas, admin_error = self._replicas()
        replica_urls = sorted({r["metrics_url"] for r in replicas or [] if r["metrics_url"]})
        urls = list(dict.fromkeys([*self._gateway_urls, *replica_urls]))
        scrapes = dict(zip(urls, self._pool.map(lambda url: scrape(self._client, url), urls), strict=True))
        windows = {url: Window(self._previous.get(url), s) for url, s in scrapes.items()}
        self._previous = scrapes
        return Sources(
            admin_url=self._api.base_url,
            replicas=replicas,
            admin_error=admin_error,
            replica_windows={url: windows[url] for url in replica_urls},
            gateway_windows=[windows[url] for url in dict.fromkeys(self._gateway_urls)],
        )

    def _replicas(self) -> tuple[list[dict[str, Any]] | None, str | None]:
        try:
            view = self._api.call("GET", "/replicas", model=self._model)
        except AdminApiError as exc:
            return None, str(exc)
        return list(view["replicas"]), None


def _title(interval_s: float, *, live: bool) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if live:
        return f"sluice top: every {interval_s:g} s, {now} (Ctrl-C quits)"
    return f"sluice top: {now}, rates and p95s over the last {interval_s:g} s"


def _run(args: argparse.Namespace, api: AdminApi) -> int:
    reader = Reader(api, args.gateway or [DEFAULT_GATEWAY_METRICS_URL], args.model)
    try:
        if args.once or args.json:
            reader.read()
            time.sleep(args.interval)
            snapshot = build_snapshot(reader.read(), args.model)
            if args.json:
                print(json.dumps(as_json(snapshot, datetime.now(UTC).isoformat()), indent=2))
            else:
                print(render(snapshot, _title(args.interval, live=False)))
        else:
            _live(reader, args.interval, args.model)
    finally:
        reader.close()
    return EXIT_OK


def _live(reader: Reader, interval_s: float, model: str | None) -> None:
    """Redraw every ``interval_s`` (on a fixed schedule: a slow scrape does not stretch the period), each
    line cut to the terminal's width so that nothing wraps and the redraw stays in place; until Ctrl-C
    (how one leaves a live view: not a failure).

    NOTE: Ctrl-C sets a flag rather than raising KeyboardInterrupt wherever the main thread is: raised
    inside the scrape pool's locks it could leave one held, and the interpreter's exit then waited on it
    forever. A redraw under way finishes first (its scrapes are bounded by ``SCRAPE_TIMEOUT_S``)."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    try:
        next_s = time.monotonic()
        while not stop.is_set():
            text = render(build_snapshot(reader.read(), model), _title(interval_s, live=True))
            columns = shutil.get_terminal_size().columns
            sys.stdout.write(CLEAR_SCREEN + "\n".join(line[:columns] for line in text.splitlines()) + "\n")
            sys.stdout.flush()
            next_s = max(next_s + interval_s, time.monotonic())  # behind schedule: skip, do not catch up
            stop.wait(max(0.0, next_s - time.monotonic()))
    finally:
        signal.signal(signal.SIGINT, previous)
    sys.stdout.write("\n")


def _handle(args: argparse.Namespace) -> int:
    try:
        api = AdminApi.from_args(args, load_settings())
    except SettingsError as exc:
        return fail(str(exc), EXIT_USAGE)
    return _run(args, api)


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"seconds in [0.1, 3600] expected, got {text!r}")
    return value


def _metrics_url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"an http(s):// URL expected, got {text!r}")
    return text


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``sluice top``'s options to ``parser``."""
    parser.add_argument(
        "--interval", type=_interval, default=2.0, metavar="S", help="seconds between refreshes (default 2)"
    )
    parser.add_argument(
        "--gateway",
        action="append",
        type=_metrics_url,
        metavar="URL",
        help=f"a gateway's metrics URL; repeat for several (default {DEFAULT_GATEWAY_METRICS_URL})",
    )
    parser.add_argument("--model", help="only this model")
    parser.add_argument(
        "--once", action="store_true", help="print one snapshot (two reads --interval apart) and exit"
    )
    parser.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")
    add_connection_options(parser)
    parser.set_defaults(handler=_handle)
