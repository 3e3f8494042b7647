"""``make run``: the whole dev stack in one foreground process tree, stopped by one Ctrl-C.

A real tritonserver serving the CPU engine (HTTP 8000, gRPC 8001, metrics 8002 on 127.0.0.1), then the
gateway on settings.gateway_host:gateway_port. The Triton server is stopped in the ``finally`` whatever
ends the gateway (Ctrl-C, SIGTERM, an error), so nothing is left behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.app import create_app
from gateway.serving import configure_logging, serve
from sluice.settings import get_settings
from sluice.tenants.base import DEV_TENANT_KEYS
from sluice.triton.launcher import TritonServer, TritonServerConfig, run_in_foreground


def banner(base_url: str, model: str, dev_tenants: bool) -> str:
    keys = "\n".join(f"    {tenant:<8} {key}" for tenant, key in DEV_TENANT_KEYS.items())
    if not dev_tenants:
        keys = "    (dev tenants disabled: SLUICE_DEV_TENANTS=false)"
    key = DEV_TENANT_KEYS["acme"]
    return f"""
Sluice is up: {base_url}/v1  (model {model})
  dev API keys:
{keys}
  try:
    curl -N {base_url}/v1/chat/completions -H 'Authorization: Bearer {key}' \\
      -H 'Content-Type: application/json' \\
      -d '{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "Hello"}}]}}'
  Ctrl-C stops everything.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-repository", type=Path, default=Path(".sluice/model_repository"))
    ap.add_argument("--triton-http-port", type=int, default=8000)
    args = ap.parse_args(argv)
    configure_logging()
    settings = get_settings()
    grpc_port = int(settings.triton_grpc_url.rsplit(":", 1)[1])
    metrics_port = int(settings.triton_metrics_url.rsplit(":", 1)[1].split("/", 1)[0])
    triton = TritonServer(
        TritonServerConfig(
            model_repository=args.model_repository,
            http_port=args.triton_http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            state_dir=settings.state_dir / "triton",
        )
    )

    def while_up() -> int:
        base_url = f"http://{settings.gateway_host}:{settings.gateway_port}"
        print(banner(base_url, settings.model_name, settings.dev_tenants), file=sys.stderr, flush=True)
        # uvicorn's own start-up lines would repeat the banner: only its warnings and errors.
        serve(create_app(settings), settings, uvicorn_log_level="warning")
        return 0

    return run_in_foreground(triton, while_up)


if __name__ == "__main__":
    sys.exit(main())
