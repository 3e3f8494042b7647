"""A FAKE Kubernetes API server (no cluster runs here): an HTTP server on 127.0.0.1 implementing only what
the autoscaler's Kubernetes actuator calls through the official client, with the real paths and JSON:

- ``GET/PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`` (autoscaling/v1 Scale; a PATCH body
  ``{"spec": {"replicas": n}}``, merge or strategic merge);
- ``PATCH /api/v1/namespaces/{ns}/pods/{name}`` (metadata.annotations merged).

Unknown objects answer 404 with a Status body, as the API server does. Every call is recorded in order
(``calls``), so a test can check what was asked and when. Also serves a FAKE replica's Triton metrics at
``/fake-replica/{id}/metrics`` (``in_flight[id]`` requests running), for the drain's idle wait.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SCALE = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)/scale$")
_POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")
_REPLICA = re.compile(r"^/fake-replica/([^/]+)/metrics$")


class FakeKubeApi:
    def __init__(self) -> None:
        self.deployments: dict[tuple[str, str], int] = {}  # (namespace, name) -> spec.replicas
        self.pods: dict[tuple[str, str], dict[str, str]] = {}  # (namespace, name) -> annotations
        self.in_flight: dict[str, int] = {}  # fake replica id -> requests running
        self.calls: list[tuple[str, str, Any]] = []  # (method, path, JSON body or None)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def replica_metrics_url(self, replica_id: str) -> str:
        return f"{self.url}/fake-replica/{replica_id}/metrics"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api._serve(self, "GET", None)

            def do_PATCH(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                api._serve(self, "PATCH", json.loads(self.rfile.read(length) or b"null"))

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def _serve(self, handler: BaseHTTPRequestHandler, method: str, body: Any) -> None:
        with self._lock:
            if not handler.path.startswith("/fake-replica/"):
                self.calls.append((method, handler.path, body))
            status, payload = self._answer(method, handler.path.split("?")[0], body)
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if match := _REPLICA.match(path):
            return 200, _triton_metrics(self.in_flight.get(match[1], 0))
        if match := _SCALE.match(path):
            key = (match[1], match[2])
            if key not in self.deployments:
                return 404, _not_found("deployments.apps", match[2])
            if method == "PATCH":
                self.deployments[key] = int(body["spec"]["replicas"])
            return 200, _scale(key, self.deployments[key])
        if (match := _POD.match(path)) and method == "PATCH":
            key = (match[1], match[2])
            if key not in self.pods:
                return 404, _not_found("pods", match[2])
            self.pods[key].update(body.get("metadata", {}).get("annotations", {}))
            metadata = {"name": key[1], "namespace": key[0], "annotations": self.pods[key]}
            return 200, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}
        return 404, _not_found("path", path)


def _scale(key: tuple[str, str], replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": key[1], "namespace": key[0]},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "selector": f"app={key[1]}"},
    }


def _not_found(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": f'{kind} "{name}" not found'}  # fmt: skip


def _triton_metrics(num_running: int) -> str:
    """The two TensorRT-LLM families a replica exports (sluice.triton.metrics reads them)."""
    kv = {"max": 100, "free": 100, "used": 0, "tokens_per": 16, "fraction": 0}
    requests = {"active": num_running, "waiting": 0, "scheduled": num_running, "context": 0, "max": 64}
    lines = [f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{k}"}} {v}' for k, v in kv.items()]
    lines += [f'nv_trt_llm_request_metrics{{request_type="{k}"}} {v}' for k, v in requests.items()]
    return "\n".join(lines) + "\n"
