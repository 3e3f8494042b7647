"""Triton replicas: start a real tritonserver, render its model repository, convert its tensors."""
