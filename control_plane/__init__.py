"""The control plane: the operator's side of Sluice (the ``sluice`` CLI; later the registry and admin API)."""
