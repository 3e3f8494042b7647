"""``sluice top``'s output: the snapshot ``top_view`` built as a table (a version's row, then its
replicas indented; a line per source that could not be read) or as JSON."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from control_plane.cli.top_view import Snapshot
from control_plane.table import render_table

HEADERS = (
    "MODEL", "VERSION", "REPLICA", "STATE", "RUNNING", "WAITING", "QUEUED", "KV %",
    "TTFT p95 ms", "ITL p95 ms", "TOK/S", "HEALTH",
)  # fmt: skip


def render(snapshot: Snapshot, title: str) -> str:
    """``title``, the table (a version's row, then its replicas indented), and a line per source that
    could not be read."""
    cells = [
        [
            row.model if not row.replica else "",
            row.version if not row.replica else "",
            f"  {row.replica}" if row.replica else "(all)",
            row.state,
            _count(row.num_running),
            _count(row.num_waiting),
            _count(row.num_queued),
            _number(row.kv_used_pct, 1),
            _number(row.ttft_p95_ms, 1),
            _number(row.itl_p95_ms, 1),
            _number(row.tokens_per_s, 1),
            row.health or "-",
        ]
        for row in snapshot.rows
    ]
    lines = [title, ""]
    lines.append(
        render_table(HEADERS, cells)
        if cells
        else "No model versions: no replica registered, no gateway traffic."
    )
    lines.append("")
    rate = _number(snapshot.gateway_output_tokens_per_s, 1)
    num_gateways = sum(1 for s in snapshot.sources if s.kind == "gateway")
    num_read = sum(1 for s in snapshot.sources if s.kind == "gateway" and s.error is None)
    lines.append(
        f"gateways: {num_read}/{num_gateways} read, {rate} output tokens/s, "
        f"{_number(snapshot.gateway_refused_per_s, 1)} refused/s; batches: "
        f"{_count(snapshot.gateway_batches_active)} running, "
        f"{_number(snapshot.gateway_batch_lines_per_s, 1)} lines/s"
    )
    lines += [f"{s.kind} {s.url}: {s.error}" for s in snapshot.sources if s.error is not None]
    lines += snapshot.notes
    return "\n".join(lines)


def as_json(snapshot: Snapshot, taken_at: str) -> dict[str, Any]:
    """What ``--json`` prints: the rows (numbers rounded to 0.1; null where unknown) and every source."""
    return {
        "taken_at": taken_at,
        "window_s": _round(snapshot.window_s),
        "gateway_output_tokens_per_s": _round(snapshot.gateway_output_tokens_per_s),
        "gateway_refused_per_s": _round(snapshot.gateway_refused_per_s),
        "gateway_batches_active": snapshot.gateway_batches_active,
        "gateway_batch_lines_per_s": _round(snapshot.gateway_batch_lines_per_s),
        "rows": [
            {k: _round(v) if isinstance(v, float) else v for k, v in asdict(row).items()}
            for row in snapshot.rows
        ],
        "sources": [asdict(s) for s in snapshot.sources],
        "notes": snapshot.notes,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
