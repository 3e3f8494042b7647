"""The control plane after a PostgreSQL outage ends (issue 26): the first admin call after the restore is
answered (it was 503 ``admin_token_store_unavailable`` 30-49 s after restores), calls while a store is
known down are refused at once, and its log says each store's outage once when it starts and once when it
ends. The service runs as an operator starts it; PostgreSQL is reached through a TCP proxy the test cuts
and restores (the server itself is never stopped)."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from control_plane_process import RunningControlPlane, running_control_plane
from log_lines import outage_levels
from pg import through_proxy
from tcp_proxy import ProxyThread

# sluice.logs.SERVICE_LOG_FORMAT: "%(asctime)s %(levelname)s [control-plane] %(name)s: %(message)s"
_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) \[control-plane\] (?P<logger>[\w.]+): (?P<message>.*)$")


def _get_replicas(service: RunningControlPlane) -> tuple[int, float, str]:
    """``GET /admin/v1/replicas``: its status, how long it took, and its error code (if any)."""
    began = time.monotonic()
    resp = httpx.get(
        f"{service.url}/admin/v1/replicas", headers={"Authorization": f"Bearer {service.token}"}, timeout=30
    )
    took_s = time.monotonic() - began
    code = resp.json().get("error", {}).get("code", "") if resp.status_code >= 400 else ""
    return resp.status_code, took_s, code


def _outage_lines(log: str) -> dict[str, list[str]]:
    """The outage lines' levels in the service's log text, by what they are about."""
    matches = (_LINE.match(line) for line in log.splitlines())
    return outage_levels((m["level"], m["message"]) for m in matches if m and m["level"] != "DEBUG")


def test_the_first_admin_call_after_a_restore_is_answered_and_the_outage_is_said_once_each_way(
    tmp_path: Path, database: str, pg_proxy: ProxyThread
) -> None:
    via_proxy = through_proxy(database, pg_proxy.port)
    with running_control_plane(tmp_path / "state", SLUICE_DATABASE_URL=via_proxy) as service:
        with ThreadPoolExecutor(max_workers=6) as pool:  # calls at once: the pools grow past one connection
            assert {s for s, _, _ in pool.map(lambda _: _get_replicas(service), range(12))} == {200}
        log_before = len(service.log_path.read_text())
        pg_proxy.cut()
        first, took_s, code = _get_replicas(service)
        # the first caller finds the outage (its connection fails its check): refused once the store's
        # probe confirms it, not after the pool's acquire timeout (5 s)
        assert (first, code) == (503, "admin_token_store_unavailable") and took_s < 1.0, (first, took_s)
        refused, took_s, _ = _get_replicas(service)
        assert refused == 503 and took_s < 0.5, (refused, took_s)  # known down: refused at once
        time.sleep(1.5)  # probes against the dead server
        pg_proxy.restore()
        restored = time.monotonic()
        while (answer := _get_replicas(service))[0] != 200:
            assert answer[0] == 503 and time.monotonic() - restored < 10, answer
            time.sleep(0.05)
        assert time.monotonic() - restored < 2.0
        with ThreadPoolExecutor(max_workers=6) as pool:  # no connection left over from the outage fails
            assert {s for s, _, _ in pool.map(lambda _: _get_replicas(service), range(12))} == {200}
        time.sleep(1.0)  # the rollout guard's next pass (it reads the registry every second)
    log = service.log_path.read_text()[log_before:]
    by_what = _outage_lines(log)
    assert by_what, log
    assert all(levels == ["WARNING", "INFO"] for levels in by_what.values()), log
    assert any(what.startswith("admin token store") for what in by_what), by_what
    # nothing else above INFO: the outage's start lines are the only warnings, one per store
    warnings = [m for m in map(_LINE.match, log.splitlines()) if m and m["level"] in ("WARNING", "ERROR")]
    assert len(warnings) == len(by_what), log
    assert "psycopg.pool" not in log, log
