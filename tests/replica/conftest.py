"""The replica tests' fixtures (a real tritonserver on free ports) live in tests/conftest.py, shared with
tests/gateway.

The replica-side modules (replica_converters, send_schedule) live beside the CPU engine's model.py and
import each other as top-level modules, as Triton's Python backend loads them (it puts the model's
version folder on sys.path); the tests import them the same way.
"""

import sys
from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parents[2] / "model_repository" / "cpu_engine" / "1"
if str(MODEL_DIR) not in sys.path:
    sys.path.insert(0, str(MODEL_DIR))
