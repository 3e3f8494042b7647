"""The gateway's side of degradation under persistent overload (``sluice.policy.degrade``; configured by
``SLUICE_DEGRADATION``): one overload detector per configured model, fed the age of the oldest interactive
request waiting in any of the model's schedulers; at admission, the fallbacks an overloaded model's request
takes, before any replica sees it.

The signal is sampled when it is read: at each admission of the model and at each scrape of the
``sluice_gateway_degraded_mode`` gauge (no timer of its own; between samples the last one holds). Entering
and leaving overload are logged once each. Event loop only, like the schedulers it reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

from gateway.errors import OpenAIError
from gateway.metrics import GatewayMetrics
from gateway.routing.router import Router, Target
from sluice.domain import RequestClass, Tenant
from sluice.policy.degrade import Degraded, Fallbacks, OverloadDetector, Transition, degrade

log = logging.getLogger(__name__)

# service_tier values that leave the class to the service (SERVICE_TIERS in gateway.openai.admission).
_CLASS_UNCHOSEN = (None, "auto")


class Degradation:
    """Each configured model's detector (owned here), read through ``route`` and ``apply`` at admission
    and through the gauge at a scrape."""

    def __init__(
        self,
        fallbacks: Mapping[str, Fallbacks],
        router: Router,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fallbacks = dict(fallbacks)
        self._router = router
        self._metrics = metrics
        self._clock = clock
        self._detectors = {
            model: OverloadDetector(f.overload_wait_s, f.enter_after_s, f.exit_after_s)
            for model, f in self._fallbacks.items()
        }
        for model in self._detectors:
            metrics.degraded_mode.labels(model).set_function(partial(self._gauge, model))

    def overloaded(self, model: str) -> bool:
        """Whether ``model``'s fallbacks apply now (a fresh sample of its signal)."""
        detector = self._detectors.get(model)
        if detector is None:
            return False
        now = self._clock()
        wait_s = self._oldest_wait_s(model, now)
        entered_at_s = detector.changed_at_s
        transition = detector.observe(now, wait_s)
        if transition is Transition.ENTERED:
            log.warning(
                "model %s is overloaded: its oldest interactive request waited over %.1f s for at least "
                "%.1f s (now %.1f s); new requests take its fallbacks: %s",
                model, detector.overload_wait_s, detector.enter_after_s, wait_s,
                _named(self._fallbacks[model]),
            )  # fmt: skip
        elif transition is Transition.EXITED:
            log.warning(
                "model %s is no longer overloaded (after %.1f s): its oldest interactive request waited at "
                "most %.1f s for at least %.1f s; new requests are served as asked",
                model, now - (entered_at_s or now), detector.overload_wait_s, detector.exit_after_s,
            )  # fmt: skip
        return detector.overloaded

    def _gauge(self, model: str) -> float:
        return 1.0 if self.overloaded(model) else 0.0

    def route(
        self, target: Target, tenant: Tenant, conversation_key: str, service_tier: str | None
    ) -> tuple[Target, Degraded | None]:
        """The request's target and the fallbacks it is subject to: ``target`` (the router's choice for
        the model it asked for) and None while that model is not overloaded; else its alias's target
        (when configured, routed, the tenant's, and with a replica: else ``target``, not aliased) and the
        fallbacks. NOTE: an alias serves as itself; its own degradation is not applied on top."""
        model = target.model
        if not self.overloaded(model):
            return target, None
        fallbacks = self._fallbacks[model]
        alias = fallbacks.alias_to
        degraded = degrade(
            fallbacks,
            alias_allowed=alias is not None and alias in self._router.models_for(tenant),
            class_chosen=service_tier not in _CLASS_UNCHOSEN,
            batch_allowed=RequestClass.BATCH in tenant.allowed_classes,
        )
        if degraded.alias_to is None:
            return target, degraded
        try:
            return self._router.route(degraded.alias_to, tenant, conversation_key), degraded
        except OpenAIError:  # the alias has no replica in rotation now: the model itself serves it
            return target, replace(degraded, alias_to=None)

    def apply(
        self, model: str, degraded: Degraded | None, max_tokens: int, request_class: RequestClass
    ) -> tuple[int, RequestClass, str]:
        """The request's output tokens and class after ``degraded`` (from ``route``; None: as asked), and
        the ``Sluice-Degraded`` header's value ("" if nothing changed); each fallback taken is counted
        under ``model``, the model the request asked for."""
        if degraded is None:
            return max_tokens, request_class, ""
        for action in degraded.taken(max_tokens):
            self._metrics.degraded.labels(model, action).inc()
        chosen_class = RequestClass.BATCH if degraded.to_batch else request_class
        return degraded.capped(max_tokens), chosen_class, degraded.header(max_tokens)

    def _oldest_wait_s(self, model: str, now: float) -> float:
        """The longest any interactive request of ``model`` has waited in this gateway, over its versions
        and their pools (those with a replica in rotation: no new request queues for another)."""
        routes = self._router.table.models.get(model)
        if routes is None:
            return 0.0
        pools = self._router.pools
        schedulers = [s for v in routes.versions for s in pools.schedulers_of(model, v).values()]
        return max((s.oldest_wait_s(now) for s in schedulers), default=0.0)


def _named(fallbacks: Fallbacks) -> str:
    """The configured fallbacks, as a log line names them: ``alias_to=small, max_tokens_cap=64, to_batch``."""
    named = {"alias_to": fallbacks.alias_to, "max_tokens_cap": fallbacks.max_tokens_cap}
    parts = [f"{name}={value}" for name, value in named.items() if value is not None]
    return ", ".join(parts + (["to_batch"] if fallbacks.to_batch else []))
