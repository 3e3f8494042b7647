"""Wiring: the autoscaler the control plane runs when ``SLUICE_AUTOSCALER=on`` (off by default, in tests and
``make run``), built from settings: the gateways' metrics as its signals, the local or the Kubernetes
actuator, the policy's configuration. Started and stopped with the service (``stack``)."""

from __future__ import annotations

from contextlib import AsyncExitStack

from prometheus_client import CollectorRegistry

from control_plane.autoscaler.actuator import Actuator
from control_plane.autoscaler.local import LocalActuator
from control_plane.autoscaler.loop import Autoscaler
from control_plane.autoscaler.metrics import AutoscalerMetrics
from control_plane.autoscaler.signals import GatewayScraper
from replicas.health import ReplicaStates
from replicas.local_replicas import LocalReplicas
from sluice.policy.autoscale import AutoscaleConfig
from sluice.settings import Settings, SettingsError
from sluice.stores.registry.base import Registry


def autoscale_config(settings: Settings) -> AutoscaleConfig:
    """The policy's configuration, or ``SettingsError`` naming the variables that contradict each other."""
    if settings.autoscaler_min_replicas > settings.autoscaler_max_replicas:
        raise SettingsError(
            f"SLUICE_AUTOSCALER_MIN_REPLICAS ({settings.autoscaler_min_replicas}) must be <= "
            f"SLUICE_AUTOSCALER_MAX_REPLICAS ({settings.autoscaler_max_replicas})"
        )
    return AutoscaleConfig(
        min_replicas=settings.autoscaler_min_replicas,
        max_replicas=settings.autoscaler_max_replicas,
        warm_pool_replicas=settings.autoscaler_warm_pool_replicas,
        ttft_slo_s=settings.autoscaler_ttft_slo_ms / 1000,
        queue_wait_target_s=settings.autoscaler_queue_wait_target_ms / 1000,
        queue_depth_per_replica=settings.autoscaler_queue_depth_per_replica,
        scale_down_cooldown_s=settings.autoscaler_scale_down_cooldown_s,
    )


def gateway_metrics_urls(settings: Settings) -> list[str]:
    urls = [u.strip() for u in settings.autoscaler_gateway_metrics_urls.split(",") if u.strip()]
    if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
        raise SettingsError(
            "SLUICE_AUTOSCALER_GATEWAY_METRICS_URLS must be comma-separated http(s):// URLs of the gateways' "
            f"/metrics, got {settings.autoscaler_gateway_metrics_urls!r}"
        )
    return urls


def _actuator(settings: Settings, local: LocalReplicas, states: ReplicaStates) -> Actuator:
    if settings.autoscaler_actuator == "local":
        return LocalActuator(local, drain_timeout_s=settings.autoscaler_drain_timeout_s)
    from kubernetes import client as kube
    from kubernetes import config as kube_config

    from control_plane.autoscaler.kube import KubeActuator

    try:  # in a pod: its service account; elsewhere: the kubeconfig
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    return KubeActuator(
        kube.ApiClient(),
        states,
        namespace=settings.autoscaler_kube_namespace,
        deployment_template=settings.autoscaler_kube_deployment,
        drain_timeout_s=settings.autoscaler_drain_timeout_s,
    )


async def open_autoscaler(
    settings: Settings,
    registry: Registry,
    local: LocalReplicas,
    states: ReplicaStates,
    metrics_registry: CollectorRegistry,
    stack: AsyncExitStack,
) -> Autoscaler | None:
    """The running autoscaler (its metrics in ``metrics_registry``: the control plane's), closed by
    ``stack``; None when ``SLUICE_AUTOSCALER`` is off."""
    if settings.autoscaler != "on":
        return None
    config = autoscale_config(settings)
    scraper = GatewayScraper(gateway_metrics_urls(settings))
    autoscaler = Autoscaler(
        registry,
        scraper,
        _actuator(settings, local, states),
        config,
        AutoscalerMetrics(metrics_registry),
        interval_s=settings.autoscaler_interval_s,
    )
    await autoscaler.start()
    stack.push_async_callback(autoscaler.close)
    return autoscaler
