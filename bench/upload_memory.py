"""A gateway's memory under concurrent uploads, with and without its upload bound.

An upload's body is read whole before its handler runs, so each one in flight holds a few times its size
(``gateway/upload_slots.py``). This starts ``python -m gateway`` (in-process engine, SQLite and files
under a temporary state directory: uploads reach no engine) once per setting of
``SLUICE_FILE_MAX_CONCURRENT_UPLOADS``, sends ``--uploads`` uploads of ``--size-mib`` MiB at once with the
official openai client, alternating between the two dev tenants (one tenant may hold half the slots), and
reads the process's peak resident memory (``VmHWM``) before and after. The settings alternate over
``--rounds``.

    .venv/bin/python -m bench.upload_memory [--size-mib 100] [--uploads 8] [--limits 4 64] [--write-docs]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai

from bench.report import cpu_description, cpu_flags, load_average, write_measured
from bench.servers import REPO_ROOT, http_ok, log

SECTION = "upload-memory"
CHECKPOINT = REPO_ROOT / ".sluice" / "models" / "sluice-tiny"
API_KEYS = ("sk-acme-dev", "sk-globex-dev")  # the dev tenants: uploads alternate between them


@dataclass(frozen=True)
class Run:
    limit: int
    seconds: float
    base_mib: float
    peak_mib: float
    num_refused: int  # 503 too_many_uploads (the client here does not retry)


def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise LookupError(field)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def one_run(limit: int, data: bytes, num_uploads: int) -> Run:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sluice-upload-") as state_dir:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.update(
            SLUICE_STATE_DIR=state_dir,
            SLUICE_CHECKPOINT_DIR=str(CHECKPOINT),
            SLUICE_ENGINE_CLIENT="inprocess",
            SLUICE_DEV_TENANTS="true",
            SLUICE_GATEWAY_HOST="127.0.0.1",
            SLUICE_GATEWAY_PORT=str(port),
            SLUICE_BATCH_RUNNER="false",
            SLUICE_FILE_MAX_BYTES=str(len(data) + 1024),
            SLUICE_FILE_MAX_CONCURRENT_UPLOADS=str(limit),
        )
        base_url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway"], cwd=REPO_ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline_s = time.monotonic() + 60
            while not http_ok(base_url + "/healthz"):
                if proc.poll() is not None or time.monotonic() > deadline_s:
                    raise RuntimeError("the gateway did not start")
                time.sleep(0.1)
            base_mib = status_mib(proc.pid, "VmHWM")
            clients = [
                openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=600)
                for key in API_KEYS
            ]

            def upload(i: int) -> bool:
                try:
                    clients[i % len(clients)].files.create(
                        file=("big.jsonl", io.BytesIO(data)), purpose="batch"
                    )
                except openai.InternalServerError:
                    return False
                return True

            started_s = time.monotonic()
            with ThreadPoolExecutor(num_uploads) as pool:
                stored = list(pool.map(upload, range(num_uploads)))
            seconds = time.monotonic() - started_s
            return Run(limit, seconds, base_mib, status_mib(proc.pid, "VmHWM"), stored.count(False))
        finally:
            proc.terminate()
            proc.wait(30)


def jsonl_of(size_mib: int) -> bytes:
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "sluice-tiny", "prompt": "a" * 900}})  # fmt: skip
    return "\n".join([line] * (size_mib * 1024 * 1024 // (len(line) + 1))).encode()


def report_lines(args: argparse.Namespace, runs: list[Run]) -> list[str]:
    lines = [
        f"CPU: {cpu_description()} (flags: {cpu_flags()}). One gateway process (`python -m gateway`, "
        "in-process engine, SQLite and files in a temporary state directory); "
        f"{args.uploads} uploads of {args.size_mib} MiB sent at once by two tenants (a tenant may hold half "
        f"the slots; openai client, no retries), {args.rounds} rounds alternating the settings; "
        f"{load_average()} at the end.",
        "",
        "| SLUICE_FILE_MAX_CONCURRENT_UPLOADS | peak RSS MiB (median) | over the idle gateway MiB | all "
        "uploads took s (median) | refused (503) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for limit in args.limits:
        mine = [r for r in runs if r.limit == limit]
        peak = statistics.median(r.peak_mib for r in mine)
        over = statistics.median(r.peak_mib - r.base_mib for r in mine)
        took = statistics.median(r.seconds for r in mine)
        lines.append(
            f"| {limit} | {peak:,.0f} | {over:,.0f} | {took:.1f} | {sum(r.num_refused for r in mine)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=100)
    parser.add_argument("--uploads", type=int, default=8)
    parser.add_argument("--limits", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    data = jsonl_of(args.size_mib)
    runs = []
    for round_ in range(args.rounds):
        for limit in args.limits:
            run = one_run(limit, data, args.uploads)
            log(f"round {round_ + 1}, limit {limit}: peak {run.peak_mib:.0f} MiB, {run.seconds:.1f} s")
            runs.append(run)
    lines = report_lines(args, runs)
    print("\n".join(lines))
    if args.write_docs:
        command = "python -m bench.upload_memory " + " ".join(sys.argv[1:] if argv is None else argv)
        write_measured(SECTION, command.strip(), lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
