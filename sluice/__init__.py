"""Sluice's shared core: the pieces every application uses (the Triton launcher first)."""
