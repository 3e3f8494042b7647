"""From a parsed request to a ``Job``: unsupported parameters, the model, the chat template, and the
deterministic limits (prompt tokens, output tokens, context, deadline), all before any engine work."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gateway.errors import OpenAIError, context_length_exceeded, invalid_request, model_not_found
from gateway.openai.idempotency import check_key, fingerprint, request_id_for
from gateway.openai.job import Job
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, unsupported_params
from gateway.state import GatewayState
from sluice.domain import RequestClass, Tenant
from sluice.text import ChatTemplateError

MAX_STOP_STRINGS = 4
SERVICE_TIERS = {
    "auto": RequestClass.INTERACTIVE,
    "default": RequestClass.INTERACTIVE,
    "flex": RequestClass.BATCH,
}


def admit_chat(
    req: ChatCompletionRequest,
    tenant: Tenant,
    gw: GatewayState,
    arrival_s: float,
    idempotency_key: str | None = None,
) -> Job:
    _check_common(req, tenant, gw)
    if not req.messages:
        raise invalid_request("'messages' must hold at least one message.", param="messages")
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    try:
        prompt_text = gw.codec.render_chat(messages, add_generation_prompt=True)
    except ChatTemplateError as exc:
        raise invalid_request(str(exc), param="messages") from None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    prompt = _Prompt(gw.codec.encode(prompt_text), "\n".join(m["content"] for m in messages))
    return _job("chatcmpl", "/v1/chat/completions", req, tenant, gw, prompt, (max_tokens, param), arrival_s,
                idempotency_key)  # fmt: skip


def admit_completion(
    req: CompletionRequest,
    tenant: Tenant,
    gw: GatewayState,
    arrival_s: float,
    idempotency_key: str | None = None,
) -> Job:
    _check_common(req, tenant, gw)
    given = req.prompt
    if isinstance(given, str):
        prompt = _Prompt(gw.codec.encode(given), given)
    elif given and all(isinstance(p, int) for p in given):
        token_ids = [int(t) for t in given]
        vocab = gw.codec.vocab_size
        if any(not 0 <= t < vocab for t in token_ids):
            raise invalid_request(f"Prompt token ids must be in [0, {vocab}).", param="prompt")
        prompt = _Prompt(token_ids, gw.codec.decode(token_ids))  # screened as the text it stands for
    elif len(given) == 1 and isinstance(given[0], str):
        prompt = _Prompt(gw.codec.encode(given[0]), given[0])
    else:
        raise invalid_request(
            "prompt must be a string, a list of one string, or a list of token ids (one prompt per request).",
            param="prompt",
        )
    return _job("cmpl", "/v1/completions", req, tenant, gw, prompt, (req.max_tokens, "max_tokens"), arrival_s,
                idempotency_key)  # fmt: skip


@dataclass(frozen=True)
class _Prompt:
    token_ids: list[int]
    text: str  # what the safety policy screens


def _check_common(req: ChatCompletionRequest | CompletionRequest, tenant: Tenant, gw: GatewayState) -> None:
    bad = unsupported_params(req)
    if bad is not None:
        raise invalid_request(bad[1], param=bad[0])
    if req.model != gw.settings.model_name or (
        tenant.allowed_models and req.model not in tenant.allowed_models
    ):
        raise model_not_found(req.model)
    if req.temperature is not None and not 0.0 <= req.temperature <= 2.0:
        raise invalid_request("temperature must be in [0, 2].", param="temperature")
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        raise invalid_request("top_p must be in (0, 1].", param="top_p")
    if req.seed is not None and not 0 <= req.seed < 2**63:
        raise invalid_request("seed must be in [0, 2**63).", param="seed")
    if len(req.stop_strings()) > MAX_STOP_STRINGS:
        raise invalid_request(f"At most {MAX_STOP_STRINGS} stop strings are supported.", param="stop")


def request_class(req: ChatCompletionRequest | CompletionRequest, tenant: Tenant) -> RequestClass:
    """``service_tier``: "auto"/"default"/absent → interactive, "flex" → batch; 403 if the tenant may
    not use that class."""
    tier = req.service_tier or "auto"
    chosen = SERVICE_TIERS.get(tier)
    if chosen is None:
        raise invalid_request(
            f"service_tier must be one of {sorted(SERVICE_TIERS)}, got {tier!r}.", param="service_tier"
        )
    if chosen not in tenant.allowed_classes:
        raise OpenAIError(
            403,
            f"This API key may not use the {chosen} class (service_tier {tier!r}).",
            type="permission_error",
            code="service_tier_not_allowed",
            param="service_tier",
        )
    return chosen


def _job(
    id_prefix: str,
    route: str,
    req: ChatCompletionRequest | CompletionRequest,
    tenant: Tenant,
    gw: GatewayState,
    prompt: _Prompt,
    max_tokens_and_param: tuple[int | None, str],
    arrival_s: float,
    idempotency_key: str | None,
) -> Job:
    settings = gw.settings
    token_ids = prompt.token_ids
    max_tokens, max_tokens_param = max_tokens_and_param
    num_prompt = len(token_ids)
    if num_prompt == 0:
        raise invalid_request("The prompt is empty.", param="prompt")
    if num_prompt > settings.max_prompt_tokens:
        raise context_length_exceeded(
            f"This model's maximum prompt length is {settings.max_prompt_tokens} tokens. "
            f"However, your prompt is {num_prompt} tokens."
        )
    context = gw.codec.max_context_tokens or (settings.max_prompt_tokens + settings.max_output_tokens)
    if max_tokens is not None:
        if max_tokens < 1:
            raise invalid_request(f"{max_tokens_param} must be at least 1.", param=max_tokens_param)
        if max_tokens > settings.max_output_tokens:
            raise invalid_request(
                f"{max_tokens_param} is too large: {max_tokens}. This model supports at most "
                f"{settings.max_output_tokens} output tokens.",
                param=max_tokens_param,
            )
        if num_prompt + max_tokens > context:
            raise context_length_exceeded(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} for the output)."
            )
    else:
        max_tokens = min(settings.default_max_tokens or settings.max_output_tokens, context - num_prompt)
        if max_tokens < 1:
            raise context_length_exceeded(
                f"This model's maximum context length is {context} tokens. However, your prompt is "
                f"{num_prompt} tokens, which leaves no room for output."
            )
    chosen_class = request_class(req, tenant)
    deadline_s = (
        settings.batch_request_deadline_s
        if chosen_class is RequestClass.BATCH
        else settings.request_deadline_s
    )
    if idempotency_key is not None:
        request_id = request_id_for(id_prefix, tenant.tenant_id, check_key(idempotency_key))
    else:
        request_id = f"{id_prefix}-{uuid.uuid4().hex}"
    return Job(
        request_id=request_id,
        route=route,
        tenant=tenant,
        model=req.model,
        prompt_token_ids=token_ids,
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=req.stop_strings(),
        ignore_eos=req.ignore_eos,
        arrival_s=arrival_s,
        deadline_s=arrival_s + deadline_s,
        request_class=chosen_class,
        prompt_text=prompt.text,
        idempotency_key=idempotency_key,
        fingerprint=fingerprint(route, req) if idempotency_key is not None else "",
    )
