"""Which model version serves a request, and the replicas, schedulers and tokenizers behind it."""
