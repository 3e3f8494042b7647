"""The gateway and the control plane run without the CPU engine: none of their modules (nor the Triton
engine client, launcher or renderer they use) imports ``cpu_engine``, whose native kernels they never
run. Only the in-process engine client loads it, when it is chosen (``gateway.engine_clients``).

Each check imports in a fresh interpreter, so modules other tests loaded do not hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVING_MODULES = (
    "gateway.app",
    "gateway.devstack",
    "sluice.engine_client",
    "gateway.engine_clients",
    "sluice.engine_client.triton",
    "sluice.triton.client",
    "replicas.launcher",
    "replicas.render",
    "control_plane.cli.main",
)


def engine_modules_after_importing(*modules: str) -> list[str]:
    """The ``cpu_engine`` modules in ``sys.modules`` after importing ``modules`` in a fresh interpreter."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "engine = [m for m in sys.modules if m == 'cpu_engine' or m.startswith('cpu_engine.')]\n"
        "print(json.dumps(sorted(engine)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_serving_path_never_imports_the_cpu_engine() -> None:
    assert engine_modules_after_importing(*SERVING_MODULES) == []


@pytest.mark.parametrize("module", ["cpu_engine.client"])
def test_the_check_sees_an_engine_import(module: str) -> None:
    """The in-process backend is the engine in this process: the check must report it."""
    assert "cpu_engine.engine" in engine_modules_after_importing(module)
