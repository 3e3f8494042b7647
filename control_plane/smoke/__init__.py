"""The first-GPU-node check (``sluice trtllm-smoke``, issue 23 item 4): ``preconditions`` (what the node
must have, each missing piece named), ``stack`` (build, render, tritonserver, gateway, checks, stop in one
``finally``) and ``checks`` (the five requests through any OpenAI-compatible gateway, pass or fail with
TTFT and tokens/s). The CLI wiring is ``control_plane/cli/trtllm_smoke.py``."""
