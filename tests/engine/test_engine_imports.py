"""The CPU engine's imports point one way: from Sluice it reads only the shared wire types
(``sluice.wire``, e.g. ``FinishReason``), never the applications nor the rest of ``sluice``.

The check imports every ``cpu_engine`` module in a fresh interpreter, so modules other tests loaded do not
hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys

# What importing the wire module loads: its package's __init__ re-exports the engine-client interface,
# which itself imports only the wire module.
ALLOWED_SLUICE_MODULES = {
    "sluice",
    "sluice.engine_client",
    "sluice.engine_client.base",
    "sluice.wire",
    "sluice.guides",  # how a guide becomes a grammar (imports only the wire and llguidance)
}
APPLICATIONS = ("gateway", "control_plane", "build_engines")


def project_modules_after_importing_the_engine() -> list[str]:
    """Every module of Sluice or an application in ``sys.modules`` once all of ``cpu_engine`` is imported."""
    script = (
        "import importlib, json, pkgutil, sys\n"
        "import cpu_engine\n"
        "for info in pkgutil.iter_modules(cpu_engine.__path__, 'cpu_engine.'):\n"
        "    importlib.import_module(info.name)\n"
        f"roots = {['sluice', *APPLICATIONS]!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_engine_imports_only_the_wire_types_from_sluice() -> None:
    loaded = project_modules_after_importing_the_engine()
    assert "sluice.wire" in loaded  # the check sees an import when there is one
    assert set(loaded) <= ALLOWED_SLUICE_MODULES, sorted(set(loaded) - ALLOWED_SLUICE_MODULES)
