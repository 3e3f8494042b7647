"""Admin tokens: the control plane's own credentials (see ``base`` for why they live here)."""
