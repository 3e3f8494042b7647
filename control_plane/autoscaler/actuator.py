"""The one interface the autoscaler acts through; implementations: local tritonserver processes
(``local.py``) and a Kubernetes Deployment per model version (``kube.py``).

Promotion and demotion between the warm pool and the routed (general) pool are registry writes the loop
makes itself, the same for every actuator; an actuator only adds replicas and takes them away.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sluice.stores.registry.base import Replica, ReplicaPool


class Actuator(ABC):
    name: str

    @abstractmethod
    async def start(self, model: str, version: str, count: int, *, pool: ReplicaPool) -> list[str]:
        """Add ``count`` replicas of the version into ``pool`` (general: routed once ready; warm: loaded,
        never routed). Returns the ids registered already (``starting``, in ``pool``); a platform whose
        replicas register themselves later returns fewer or none, and the loop moves those into ``pool``
        when they appear."""

    @abstractmethod
    async def retire(self, replica: Replica) -> None:
        """Take the replica away without killing a request: drain it first (the registry says draining,
        gateways send it nothing new), stop it once it holds no request or after the drain bound. Returns
        once it is draining; the rest happens in the background."""

    @abstractmethod
    async def close(self) -> None:
        """Stop background work (retirements in progress are the platform's to finish)."""
