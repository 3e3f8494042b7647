"""``sluice replicas list|start|drain|stop|register|remove|pool``: the replicas serving the registry's
versions, through the admin API (``/admin/v1/replicas``).

``sluice replicas list [--model M]``: each replica's state, endpoint, pool, last health check and, when the
table fits the terminal, the metrics URL gateways read its load from (``--json`` always has it).
``sluice replicas start MODEL VERSION [--count N] [--checkpoint DIR]`` starts local tritonserver replicas
on the control plane's machine from the version's artifact (a local folder, or an ``s3://`` artifact of
the weight store pulled into that machine's weight cache: nothing downloaded when it is cached) or from
``--checkpoint``, and waits until each is ready and verified (serving the version's weights digest, one
first token made), printing each one's cold start by phase (download, verify, load, first token), or
exits 1 naming the one that failed and why; ``--no-wait`` returns once they are registered ``starting``.
``drain REPLICA``: gateways send it nothing new. ``stop REPLICA``: drain, wait
for its requests (``--timeout-s``), stop its process and remove it (a replica this control plane
started). ``register REPLICA --endpoint HOST:PORT [--metrics-url URL] MODEL VERSION`` / ``remove
REPLICA``: a replica started elsewhere (its Triton metrics URL, e.g. http://HOST:8002/metrics, lets
gateways read its load; without one they route to it without reading it). ``start`` and ``register``
take ``--pool general|long-prompt|warm`` (default general); ``pool REPLICA POOL`` moves a replica to
another pool in one registry write (``pool REPLICA general`` promotes a warm one into rotation).

Exit codes: 0 done; 1 the service refused or failed, a replica failed, or a wait timed out; 2 usage.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from control_plane.cli.admin_client import AdminApi
from control_plane.cli.admin_commands import EXIT_FAILED, EXIT_OK, add_options, fail, print_json, when
from control_plane.table import render_table
from sluice.stores.registry.base import ReplicaPool

HEADERS = (
    "REPLICA", "MODEL", "VERSION", "STATE", "ENDPOINT", "METRICS", "LOCAL", "POOL", "LAST CHECK", "DETAIL",
)  # fmt: skip
_METRICS_COLUMN = HEADERS.index("METRICS")
POLL_INTERVAL_S = 0.5
STOP_GRACE_S = 60.0  # beyond --timeout-s: the process's own stop, and the removal


def _row(replica: dict[str, Any]) -> list[str]:
    return [
        replica["replica_id"],
        replica["model"],
        replica["version"],
        replica["state"],
        replica["endpoint"],
        replica["metrics_url"] or "-",
        "yes" if replica["local"] else "no",
        replica["pool"],
        when(replica["last_health_at"], "never"),
        replica["health_detail"] or "-",
    ]


def print_replicas(replicas: list[dict[str, Any]]) -> None:
    """The table, with the METRICS column only when it fits the terminal (``--json`` always has it)."""
    rows = [_row(r) for r in replicas]
    table = render_table(HEADERS, rows)
    if max(len(line) for line in table.splitlines()) > shutil.get_terminal_size().columns:
        drop = _METRICS_COLUMN
        table = render_table(
            HEADERS[:drop] + HEADERS[drop + 1 :], [row[:drop] + row[drop + 1 :] for row in rows]
        )
    print(table)


def _listed(api: AdminApi, model: str | None = None) -> dict[str, dict[str, Any]]:
    view = api.call("GET", "/replicas", model=model)
    return {r["replica_id"]: r for r in view["replicas"]}


def _list(api: AdminApi, args: argparse.Namespace) -> int:
    view = api.call("GET", "/replicas", model=args.model)
    if args.json:
        print_json(view)
    elif not view["replicas"]:
        print("No replicas registered: start some with `sluice replicas start MODEL VERSION`.")
    else:
        print_replicas(view["replicas"])
    return EXIT_OK


def _start(api: AdminApi, args: argparse.Namespace) -> int:
    checkpoint = str(Path(args.checkpoint).resolve()) if args.checkpoint else None
    body = {
        "model": args.model, "version": args.version, "count": args.count, "checkpoint": checkpoint,
        "pool": args.pool,
    }  # fmt: skip
    started = api.call("POST", "/replicas", body)["replicas"]
    ids = [r["replica_id"] for r in started]
    if not args.no_wait:
        started, problem = _wait_ready(api, args.model, ids, args.timeout_s)
        if problem:
            if args.json:
                print_json({"replicas": started})
            else:
                print_replicas(started)
            return fail(problem, EXIT_FAILED)
    if args.json:
        print_json({"replicas": started})
        return EXIT_OK
    print_replicas(started)
    if args.no_wait:
        print(f"Started {len(ids)} replica(s): `sluice replicas list` shows when they are ready.")
        return EXIT_OK
    print(f"{len(ids)} replica(s) of {args.model} version {args.version} ready and verified.")
    for replica in started:
        if replica.get("cold_start"):
            print(f"Cold start of {replica['replica_id']}: {describe_cold_start(replica['cold_start'])}")
    return EXIT_OK


def describe_cold_start(cold: dict[str, Any]) -> str:
    """``download 0.41 s (28.6 MB in 5 files), verify 0.00 s (manifest), load 2.93 s, first token
    0.21 s; 3.55 s in all`` from a replica's ``cold_start`` (phases not reached are left out)."""
    parts = []
    if cold.get("download_s") is not None:
        fetched = f"{cold['num_downloaded_bytes'] / 1e6:.1f} MB in {cold['num_downloaded_files']} files"
        parts.append(f"download {cold['download_s']:.2f} s ({fetched})")
    if cold.get("verify_s") is not None:
        parts.append(f"verify {cold['verify_s']:.2f} s ({cold['verified_by']})")
    for name, key in (("load", "load_s"), ("first token", "first_token_s")):
        if cold.get(key) is not None:
            parts.append(f"{name} {cold[key]:.2f} s")
    return f"{', '.join(parts) or 'nothing yet'}; {cold['total_s']:.2f} s in all"


def _wait_ready(
    api: AdminApi, model: str, ids: list[str], timeout_s: float
) -> tuple[list[dict[str, Any]], str | None]:
    """Poll until every replica is ready; (their rows, None) or (their rows, what went wrong)."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = _listed(api, model)
        rows = [listed[i] for i in ids if i in listed]
        gone = [i for i in ids if i not in listed]
        if gone:
            return rows, f"replica(s) {', '.join(gone)} left the registry while starting"
        failed = [r for r in rows if r["state"] == "failed"]
        if failed:
            return rows, f"replica {failed[0]['replica_id']} failed: {failed[0]['health_detail']}"
        if all(r["state"] == "ready" for r in rows):
            return rows, None
        if time.monotonic() >= deadline:
            waiting = ", ".join(f"{r['replica_id']} ({r['state']})" for r in rows if r["state"] != "ready")
            return rows, f"not ready within {timeout_s:g} s: {waiting}"
        time.sleep(POLL_INTERVAL_S)


def _drain(api: AdminApi, args: argparse.Namespace) -> int:
    replica = api.call("POST", f"/replicas/{args.replica}/drain")
    if args.json:
        print_json(replica)
    else:
        print(f"Replica {args.replica} is draining: gateways send it nothing new; requests in flight finish.")
    return EXIT_OK


def _stop(api: AdminApi, args: argparse.Namespace) -> int:
    # NOTE: not waited for in the call (an HTTP request would outlast the client's timeout): the replica
    # is drained now, and leaves the list once its requests finished and its process stopped.
    answer = api.call("POST", f"/replicas/{args.replica}/stop", {"timeout_s": args.timeout_s, "wait": False})
    started_s = time.monotonic()
    deadline = started_s + args.timeout_s + STOP_GRACE_S
    while args.replica in _listed(api):
        if time.monotonic() >= deadline:
            return fail(
                f"replica {args.replica} is still registered: see the control plane's log", EXIT_FAILED
            )
        time.sleep(POLL_INTERVAL_S)
    stopped = {**answer, "state": "stopped", "waited_s": round(time.monotonic() - started_s, 1)}
    if args.json:
        print_json(stopped)
    else:
        print(
            f"Replica {args.replica} stopped after {stopped['waited_s']:g} s and removed from the registry."
        )
    return EXIT_OK


def _register(api: AdminApi, args: argparse.Namespace) -> int:
    body = {"endpoint": args.endpoint, "model": args.model, "version": args.version, "pool": args.pool}
    if args.metrics_url is not None:
        body["metrics_url"] = args.metrics_url
    replica = api.call("PUT", f"/replicas/{args.replica}", body)
    if args.json:
        print_json(replica)
        return EXIT_OK
    print_replicas([replica])
    if replica["state"] != "ready":
        print("Not ready yet: the health checks mark it ready once it serves the version's weights.")
    return EXIT_OK


def _pool(api: AdminApi, args: argparse.Namespace) -> int:
    replica = api.call("POST", f"/replicas/{args.replica}/pool", {"pool": args.pool})
    if args.json:
        print_json(replica)
    else:
        print(f"Replica {args.replica} is in the {replica['pool']} pool.")
    return EXIT_OK


def _remove(api: AdminApi, args: argparse.Namespace) -> int:
    api.call("DELETE", f"/replicas/{args.replica}")
    if args.json:
        print_json({"replica_id": args.replica, "removed": True})
    else:
        print(f"Replica {args.replica} removed from the registry.")
    return EXIT_OK


def _count(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError(f"a count of 1 to 8 expected, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"seconds in [0, 3600] expected, got {text!r}")
    return value


_POOLS = [str(p) for p in ReplicaPool]
_POOL_HELP = "general (every request; the default), long-prompt (long prompts), warm (loaded, routed nothing)"


def register(parser: argparse.ArgumentParser) -> None:
    """Add the subcommands under ``parser`` (``sluice replicas``)."""
    sub = parser.add_subparsers(dest="replicas_command", metavar="COMMAND", required=True)
    list_ = sub.add_parser("list", help="every registered replica, its state and last health check")
    list_.add_argument("--model", help="only this model's")
    add_options(list_, _list)

    start = sub.add_parser("start", help="start local tritonserver replicas of a version, wait until ready")
    start.add_argument("model", metavar="MODEL")
    start.add_argument("version", metavar="VERSION", help="a registered version named by a positive integer")
    start.add_argument("--count", type=_count, default=1, help="how many (1-8; default 1)")
    start.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="its weights, a folder on the control plane's machine (default: the version's artifact, a "
        "local folder or s3://, fetched into that machine's weight cache)",
    )
    start.add_argument("--no-wait", action="store_true", help="return once registered, before they are ready")
    start.add_argument("--timeout-s", type=_seconds, default=180.0, help="how long to wait (default 180)")
    start.add_argument("--pool", choices=_POOLS, default=str(ReplicaPool.GENERAL), help=_POOL_HELP)
    add_options(start, _start)

    drain = sub.add_parser("drain", help="gateways send the replica nothing new")
    drain.add_argument("replica", metavar="REPLICA")
    add_options(drain, _drain)

    stop = sub.add_parser("stop", help="drain, wait for its requests, stop it and remove it")
    stop.add_argument("replica", metavar="REPLICA")
    stop.add_argument("--timeout-s", type=_seconds, default=30.0, help="wait for requests (default 30)")
    add_options(stop, _stop)

    register_ = sub.add_parser("register", help="register a replica started elsewhere")
    register_.add_argument("replica", metavar="REPLICA")
    register_.add_argument("model", metavar="MODEL")
    register_.add_argument("version", metavar="VERSION")
    register_.add_argument("--endpoint", required=True, help="its Triton gRPC address, host:port")
    register_.add_argument(
        "--metrics-url",
        metavar="URL",
        help="its Triton metrics, http(s)://host:port/path (e.g. http://HOST:8002/metrics): where gateways "
        "read its load; without it they do not",
    )
    register_.add_argument("--pool", choices=_POOLS, default=str(ReplicaPool.GENERAL), help=_POOL_HELP)
    add_options(register_, _register)

    pool = sub.add_parser("pool", help="move a replica to another pool (general promotes a warm one)")
    pool.add_argument("replica", metavar="REPLICA")
    pool.add_argument("pool", metavar="POOL", choices=_POOLS, help=_POOL_HELP)
    add_options(pool, _pool)

    remove = sub.add_parser("remove", help="remove a replica started elsewhere from the registry")
    remove.add_argument("replica", metavar="REPLICA")
    add_options(remove, _remove)
