"""Prometheus's binaries (``prometheus``, ``promtool``) for the tests, from Debian's package registry:
``apt-get download prometheus`` and ``dpkg -x`` into ~/.cache/sluice/prometheus (no root, nothing
installed system-wide), once per machine. Grafana is not in Debian's registry, so no test runs it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CACHE = Path.home() / ".cache" / "sluice" / "prometheus"
FETCH_TIMEOUT_S = 300


def prometheus_bin_dir() -> Path | str:
    """The folder holding ``prometheus`` and ``promtool``, fetched if needed; a reason string when they
    cannot be had (no apt-get or dpkg, no registry reachable)."""
    on_path = shutil.which("promtool"), shutil.which("prometheus")
    if all(on_path):
        return Path(on_path[0]).parent  # type: ignore[arg-type]
    bin_dir = CACHE / "root" / "usr" / "bin"
    if (bin_dir / "promtool").is_file() and (bin_dir / "prometheus").is_file():
        return bin_dir
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return "Prometheus is not installed and this is not a Debian-like system (no apt-get, dpkg)"
    download = CACHE / "download"
    download.mkdir(parents=True, exist_ok=True)
    try:
        got = subprocess.run(
            ["apt-get", "download", "prometheus"], cwd=download, capture_output=True, text=True,
            timeout=FETCH_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"apt-get download prometheus took over {FETCH_TIMEOUT_S} s"
    debs = sorted(download.glob("prometheus_*.deb"))
    if got.returncode != 0 or not debs:
        return f"apt-get download prometheus failed: {got.stderr.strip()[-300:]}"
    unpacked = subprocess.run(
        ["dpkg", "-x", str(debs[-1]), str(CACHE / "root")], capture_output=True, text=True
    )
    if unpacked.returncode != 0:
        return f"dpkg -x {debs[-1].name} failed: {unpacked.stderr.strip()[-300:]}"
    return bin_dir
