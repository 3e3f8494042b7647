"""The replicas a control plane keeps: their health checks (``health``) and, on one machine, their
``tritonserver`` processes and weights (``local_replicas``, ``local_replica``, ``replica_weights``). The
admin API (``control_plane.service``) and the autoscaler both drive them; neither is imported here."""
