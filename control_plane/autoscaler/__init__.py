"""The autoscaler (issue 12): sets each routed model version's replicas from the gateways' queue and TTFT
signals with the pure policy ``sluice.policy.autoscale`` (the simulator runs the same one), keeps a warm
pool, and acts through one ``Actuator`` interface.

- ``signals``: scrape the gateways' /metrics; windowed p95s from histogram bucket deltas.
- ``loop``: the round: registry snapshot -> counts per version -> policy -> actions; logs and metrics.
- ``actuator``: the interface; ``local`` (tritonserver processes) and ``kube`` (a Deployment's scale).
- ``metrics``: desired replicas, warm pool, pressure, decisions by direction and reason.
- ``service``: built from settings and started by the control plane when ``SLUICE_AUTOSCALER=on``.
"""
