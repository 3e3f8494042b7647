"""A Triton replica from outside: render its model repository (``render``), launch ``tritonserver`` on it
(``launcher``), probe and verify what it serves (``probe``, ``verify``), check its health (``health``),
and, on one machine, run replicas as local processes with their weights (``local_replicas``,
``local_replica``, ``replica_weights``). The control plane, its autoscaler, ``build_engines`` and the
gateway's devstack import it; it imports only ``sluice``'s core and stores, never an application."""
