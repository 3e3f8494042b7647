"""Make a gateway's file expire now, as time would: its metadata's ``expires_at`` (in the directory store
under the gateway's state directory) set to a second ago. The API takes at least an hour."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path


def expire_now(state_dir: Path, file_id: str) -> None:
    [metadata] = (state_dir / "files" / "files").glob(f"*/{file_id}.json")
    fields = json.loads(metadata.read_text())
    fields["expires_at"] = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    temp = metadata.with_name(metadata.name + "~tmp")  # renamed over it: a sweep never reads half of it
    temp.write_text(json.dumps(fields))
    temp.replace(metadata)


def stored_keys(state_dir: Path) -> list[str]:
    """Every key in the gateway's directory store."""
    root = state_dir / "files"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
