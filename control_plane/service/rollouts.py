"""``/admin/v1/models/{model}/rollout``: a model's rollout, for release managers.

- ``GET`` (viewer): the rollout (steps, where it is, its state and guard), the route now, and the versions
  compared on live traffic since the step began (requests, errors, tokens, TTFT p95, inter-token p95, from
  the usage ledger), with the guard's last verdict.
- ``POST`` (release-manager) ``{version, steps_bp, guard?, reason?}``: start; the route goes to the first
  step at once.
- ``POST .../advance|pause|resume|rollback`` (release-manager) ``{reason?}``.

Each move is one registry write (``sluice.stores.registry.rollouts``): the rollout, the route and the
versions' states together, one generation; the answer carries the generation read right after it. Gateways
follow the route, so the write is the traffic change; a rollback drains the canary's replicas (they finish
what they hold) rather than killing them. Refusals come with the registry's words: 409 while another rollout
is active, 400 for a move the rollout's state or the route rules do not allow.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, JSONBody

from control_plane.service.auth import SECURITY_SCHEME, needs, principal_of, require_admin
from control_plane.service.errors import AdminError
from control_plane.service.models import RouteEntryView
from control_plane.service.release_common import model_name, registry_errors, release_responses
from control_plane.service.releases import model_detail
from control_plane.service.rollout_guard import GuardVerdict
from control_plane.service.state import state_of
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.ledger.base import LedgerUnavailable, VersionTraffic
from sluice.stores.registry.rollouts import Rollout, RolloutError, RolloutGuard, RolloutMove

log = logging.getLogger("sluice.control_plane")


class GuardBody(msgspec.Struct, forbid_unknown_fields=True):
    """The guard's bounds: roll back when the canary is worse than the stable version by more than these;
    advance when within them; hold while either has fewer than ``min_requests`` in the step."""

    min_requests: int = 100
    max_error_rate_increase: float = 0.01  # absolute: 0.01 is one more failure in a hundred
    max_ttft_p95_ratio: float = 1.5
    max_itl_p95_ratio: float = 1.5
    interval_s: float = 30.0  # how often it judges


class StartRolloutBody(msgspec.Struct, forbid_unknown_fields=True):
    version: str  # the canary: warming, serving or draining (start sets it serving)
    steps_bp: list[int]  # its share per step in basis points, increasing, ending at 10000
    guard: GuardBody | None = None  # None: people advance it
    reason: str = ""


class MoveBody(msgspec.Struct, forbid_unknown_fields=True):
    reason: str = ""  # kept with the rollout and in the audit log


class RolloutView(msgspec.Struct):
    model: str
    stable_version: str
    canary_version: str
    state: str  # running, paused, completed, rolled_back
    steps_pct: list[float]  # the canary's share at each step, percent
    step_index: int  # 0-based
    canary_pct: float  # its share at this step
    guard: GuardBody | None
    started_by: str
    started_at: datetime
    step_started_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    reason: str


class TrafficView(msgspec.Struct):
    version: str
    role: str  # stable, canary, or other (a version the route no longer gives traffic, still finishing)
    num_requests: int
    num_errors: int
    error_rate: float
    prompt_tokens: int
    output_tokens: int
    ttft_p95_ms: float | None  # None: no request measured one
    itl_p95_ms: float | None


class GuardVerdictView(msgspec.Struct):
    at: datetime
    step_index: int
    action: str  # advance, hold, rollback
    reason: str
    applied: bool


class RolloutStatus(msgspec.Struct):
    generation: int  # the registry state the route is read at
    model: str
    rollout: RolloutView | None  # None: the model never had one
    route: list[RouteEntryView] | None
    traffic_since: datetime | None  # the step's start: the window compared
    traffic: list[TrafficView] | None  # by version; None when the ledger is unavailable
    traffic_unavailable: str | None
    guard_last: GuardVerdictView | None  # this control plane's last judgement of it


class RolloutChanged(msgspec.Struct):
    generation: int  # read right after the change: a gateway at it (or later) routes by it
    rollout: RolloutView
    route: list[RouteEntryView] | None


def rollout_view(r: Rollout) -> RolloutView:
    g = r.guard
    guard = (
        None
        if g is None
        else GuardBody(
            g.min_requests, g.max_error_rate_increase, g.max_ttft_p95_ratio, g.max_itl_p95_ratio, g.interval_s
        )
    )
    return RolloutView(
        model=r.model,
        stable_version=r.stable_version,
        canary_version=r.canary_version,
        state=str(r.state),
        steps_pct=[bp / 100 for bp in r.steps_bp],
        step_index=r.step_index,
        canary_pct=r.canary_step_bp / 100,
        guard=guard,
        started_by=r.started_by,
        started_at=r.started_at,
        step_started_at=r.step_started_at,
        updated_at=r.updated_at,
        finished_at=r.finished_at,
        reason=r.reason,
    )


def traffic_views(rollout: Rollout, traffic: list[VersionTraffic]) -> list[TrafficView]:
    """Both versions always (zeros without traffic), then any other with traffic in the window."""
    by_version = {t.model_version: t for t in traffic}
    roles = {rollout.stable_version: "stable", rollout.canary_version: "canary"}
    versions = [rollout.stable_version, rollout.canary_version]
    versions += [v for v in sorted(by_version) if v not in roles]
    views = []
    for version in versions:
        t = by_version.get(version) or VersionTraffic(version, 0, 0, 0, 0, None, None)
        views.append(
            TrafficView(
                version=version,
                role=roles.get(version, "other"),
                num_requests=t.num_requests,
                num_errors=t.num_errors,
                error_rate=t.error_rate,
                prompt_tokens=t.prompt_tokens,
                output_tokens=t.output_tokens,
                ttft_p95_ms=t.ttft_p95_ms,
                itl_p95_ms=t.itl_p95_ms,
            )
        )
    return views


def _verdict_view(v: GuardVerdict | None) -> GuardVerdictView | None:
    return None if v is None else GuardVerdictView(v.at, v.step_index, str(v.action), v.reason, v.applied)


def _guard(body: GuardBody | None) -> RolloutGuard | None:
    if body is None:
        return None
    try:
        return RolloutGuard(**msgspec.structs.asdict(body))
    except RolloutError as exc:
        raise AdminError(400, str(exc), code="invalid_change", param="guard") from exc


class RolloutController(Controller):
    path = "/admin/v1/models/{model:str}/rollout"
    tags = ["Rollouts"]  # noqa: RUF012 (Litestar reads these class attributes)
    guards = [require_admin]  # noqa: RUF012
    security = [{SECURITY_SCHEME: []}]  # noqa: RUF012

    @get("/", opt=needs(Role.VIEWER), responses=release_responses(401, 404, 503))
    async def status(self, request: Request[Any, Any, Any], model: FromPath[str]) -> RolloutStatus:
        """The rollout, the route, and the versions compared on live traffic since the step began."""
        name, cp = model_name(model), state_of(request)
        with registry_errors():
            rollout = await cp.registry.get_rollout(name)
            detail = await model_detail(cp.registry, name)
        status = RolloutStatus(detail.generation, name, None, detail.model.route, None, None, None, None)
        if rollout is None:
            return status
        status.rollout = rollout_view(rollout)
        status.traffic_since = rollout.step_started_at
        status.guard_last = _verdict_view(cp.rollouts.guard.last_verdicts.get(name))
        try:
            traffic = await cp.rollouts.ledger.version_traffic(name, rollout.step_started_at)
            status.traffic = traffic_views(rollout, traffic)
        except LedgerUnavailable as exc:
            # NOTE: the ledger's store reports its outage once each way (sluice.outages).
            log.debug("rollout status of %s: the usage ledger is unavailable: %s", name, exc)
            status.traffic_unavailable = "The usage ledger is unavailable: no traffic to compare now."
        return status

    @post("/", opt=needs(Role.RELEASE_MANAGER), responses=release_responses(400, 401, 403, 404, 409, 503))
    async def start(
        self, request: Request[Any, Any, Any], model: FromPath[str], data: JSONBody[StartRolloutBody]
    ) -> RolloutChanged:
        """Start moving the model's traffic from the version its route gives 100% to ``version``, in
        ``steps_bp``; the route goes to the first step now."""
        name, registry, actor = model_name(model), state_of(request).registry, principal_of(request).name
        guard = _guard(data.guard)
        with registry_errors():
            rollout = await registry.start_rollout(
                name, data.version, steps_bp=data.steps_bp, actor=actor, guard=guard, reason=data.reason
            )
            changed = await _changed(request, rollout)
        log.info(
            "rollout of %s started by %s: %s -> %s, steps %s%%, guard %s",
            name,
            actor,
            rollout.stable_version,
            rollout.canary_version,
            changed.rollout.steps_pct,
            "on" if guard else "off",
        )
        return changed

    async def _move(
        self, request: Request[Any, Any, Any], model: str, move: RolloutMove, data: MoveBody | None
    ) -> RolloutChanged:
        name, registry, actor = model_name(model), state_of(request).registry, principal_of(request).name
        reason = "" if data is None else data.reason
        with registry_errors():
            rollout = await registry.move_rollout(name, move, actor=actor, reason=reason)
            changed = await _changed(request, rollout)
        log.info(
            "rollout of %s: %s by %s, now %s at step %d/%d (canary %s at %.2f%%)",
            name,
            move,
            actor,
            rollout.state,
            rollout.step_index + 1,
            len(rollout.steps_bp),
            rollout.canary_version,
            changed.rollout.canary_pct,
        )
        return changed

    @post(
        "/advance",
        opt=needs(Role.RELEASE_MANAGER),
        status_code=200,
        responses=release_responses(400, 401, 403, 404, 503),
    )
    async def advance(
        self, request: Request[Any, Any, Any], model: FromPath[str], data: JSONBody[MoveBody | None] = None
    ) -> RolloutChanged:
        """The next step (a running rollout only); at 100% it completes and the stable version drains."""
        return await self._move(request, model, RolloutMove.ADVANCE, data)

    @post(
        "/pause",
        opt=needs(Role.RELEASE_MANAGER),
        status_code=200,
        responses=release_responses(400, 401, 403, 404, 503),
    )
    async def pause(
        self, request: Request[Any, Any, Any], model: FromPath[str], data: JSONBody[MoveBody | None] = None
    ) -> RolloutChanged:
        """Hold the step: the guard leaves it alone and advance is refused until resumed."""
        return await self._move(request, model, RolloutMove.PAUSE, data)

    @post(
        "/resume",
        opt=needs(Role.RELEASE_MANAGER),
        status_code=200,
        responses=release_responses(400, 401, 403, 404, 503),
    )
    async def resume(
        self, request: Request[Any, Any, Any], model: FromPath[str], data: JSONBody[MoveBody | None] = None
    ) -> RolloutChanged:
        """Running again, at the same step."""
        return await self._move(request, model, RolloutMove.RESUME, data)

    @post(
        "/rollback",
        opt=needs(Role.RELEASE_MANAGER),
        status_code=200,
        responses=release_responses(400, 401, 403, 404, 503),
    )
    async def rollback(
        self, request: Request[Any, Any, Any], model: FromPath[str], data: JSONBody[MoveBody | None] = None
    ) -> RolloutChanged:
        """One write: the stable version back at 100% (and serving), the canary draining. Also undoes a
        completed rollout while the old version is not retired."""
        return await self._move(request, model, RolloutMove.ROLLBACK, data)


async def _changed(request: Request[Any, Any, Any], rollout: Rollout) -> RolloutChanged:
    detail = await model_detail(state_of(request).registry, rollout.model)
    return RolloutChanged(detail.generation, rollout_view(rollout), detail.model.route)
