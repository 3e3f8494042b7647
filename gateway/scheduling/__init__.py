"""Where a request waits: per-model fair queues, dispatch to replicas (policies in sluice.policy)."""
