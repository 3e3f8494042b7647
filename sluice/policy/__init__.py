"""Pure scheduling policies shared by the gateway and the fleet simulator (control_plane/sim).

State and ``now`` in, a decision out: nothing here awaits, reads a clock or does I/O, so the simulator
drives exactly the code the gateway runs, on simulated time.

- ``fair_queue``: one model's waiting requests; interactive and batch classes; weighted fair queueing
  between tenants by tokens served (a virtual token counter, VTC); batch floor share and ageing;
  requests that can no longer meet their deadline are dropped at the head.
- ``admission``: how deep the queue may get, from the deadline and the measured drain rate, and the
  Retry-After for a refusal.
- ``dispatch``: which replica (if any) may take the next request, from its KV headroom, its waiting count
  and its inter-token latency against a target; ``dispatch_pass`` runs it over the queue.
- ``load``: a replica's load as dispatch sees it; ``placement``: the score that ranks the replicas that
  may take a request, with tenant-scoped prefix affinity; ``affinity``: the bounded memory of which
  replica each prefix went to (state, owned by one scheduler, read as a view).
- ``rollout``: which model version serves a request (sticky per conversation), rollout steps, the guard.
- ``share``: whether a tenant holds more than its share of the replicas.
- ``rate``: a sliding-window rate meter (the drain rate).
- ``autoscale``: how many replicas a model version should have (queue and TTFT against the SLO), warm pool.
"""
