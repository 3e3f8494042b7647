"""From a parsed request to a ``Job``: unsupported parameters, the model, the chat template, and the
deterministic limits (prompt characters, prompt tokens, output tokens, context, deadline), all before any
engine work.

Templating and tokenizing cost about 0.4 s per MiB of text, so a prompt above ``OFF_LOOP_MIN_CHARS`` is
prepared in a worker thread (``tokenizers`` releases the GIL) and never stalls the other streams; and no
prompt above the character bound (``Settings.prompt_limit_chars``) is prepared at all.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from gateway.errors import OpenAIError, context_length_exceeded, invalid_request, out_of_range
from gateway.openai.idempotency import check_key, fingerprint
from gateway.openai.job import Job
from gateway.openai.prompts import MAX_PROMPTS
from gateway.openai.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, unsupported_params
from gateway.openai.structured import check_guide, guide_of
from gateway.openai.tools import ToolPlan, template_tool_call, template_tools, tool_plan
from gateway.routing.router import Target
from gateway.state import GatewayState
from sluice.domain import RequestClass, Tenant
from sluice.engine_client import Sampling
from sluice.engine_limits import EngineLimits
from sluice.policy.degrade import Degraded
from sluice.policy.rollout import conversation_key
from sluice.settings import Settings
from sluice.text import ChatTemplateError
from sluice.wire import Guide

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256  # each; the stream holds back up to this many characters while it may match
# Prompts longer than this are templated and tokenized in a worker thread (~3 ms of work on the loop).
OFF_LOOP_MIN_CHARS = 8 * 1024
SERVICE_TIERS = {
    "auto": RequestClass.INTERACTIVE,
    "default": RequestClass.INTERACTIVE,
    "flex": RequestClass.BATCH,
}
# The chat template's role for each API role: "developer" is OpenAI's newer name for "system".
_TEMPLATE_ROLES = {"developer": "system"}


async def admit_chat(
    req: ChatCompletionRequest,
    tenant: Tenant,
    gw: GatewayState,
    arrival_s: float,
    idempotency_key: str | None = None,
    conversation_id: str | None = None,
) -> Job:
    target, request_id, degraded = _check_common(req, tenant, gw, "chatcmpl", conversation_id)
    guide = guide_of(req.response_format)
    if guide is not None and req.ignore_eos:
        raise invalid_request(
            "ignore_eos cannot be combined with a JSON response_format.", param="ignore_eos"
        )
    await check_guide(guide, target.codec, "response_format")
    # Tools (gateway.openai.tools): a forced call is decoded by its guide, checked as a response_format's
    # is. NOTE: the answer is read by the same plan: ``tool_plan(req, job.target.tool_call_parser)``.
    plan = tool_plan(req, target.tool_call_parser)
    if plan is not None and plan.guide is not None:
        await check_guide(plan.guide, target.codec, plan.guide_param)
        guide = plan.guide
    if not req.messages:
        raise invalid_request(
            "'messages' must hold at least one message.", param="messages", code="empty_array"
        )
    tools = template_tools(req)
    messages: list[dict[str, Any]] = []
    # What the safety policy screens: every text that reaches the prompt (names, tool calls and results,
    # the tools' descriptions and schemas included).
    screened_parts = [] if tools is None else [json.dumps(tools, ensure_ascii=False)]
    for i, m in enumerate(req.messages):
        message, texts = _template_message(m, i)
        messages.append(message)
        screened_parts.append("\n".join(texts))
    screened = "\n".join(screened_parts)
    _check_prompt_chars(len(screened), gw, "messages")
    try:
        token_ids = await _prepare(
            len(screened), functools.partial(target.codec.encode_chat, tools=tools), messages
        )
    except ChatTemplateError as exc:
        raise invalid_request(str(exc), param="messages") from None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    prompt = _Prompt(token_ids, screened, "messages")
    reading = plan if plan is not None and plan.reads_calls else None
    return _job(request_id, target, "/v1/chat/completions", req, tenant, gw, prompt, (max_tokens, param),
                arrival_s, idempotency_key, degraded, guide, reading)  # fmt: skip


def _template_message(m: ChatMessage, i: int) -> tuple[dict[str, Any], list[str]]:
    """Message ``i`` as chat templates take it (Hugging Face's shape), and its texts to screen."""
    message: dict[str, Any] = {"role": _TEMPLATE_ROLES.get(m.role, m.role), "content": m.text()}
    texts = [message["content"]]
    if m.name is not None:
        message["name"] = m.name
        texts.insert(0, m.name)
    if m.tool_calls:
        if m.role != "assistant":
            raise invalid_request(
                "Only assistant messages carry tool_calls.", param=f"messages[{i}].tool_calls"
            )
        message["tool_calls"] = [template_tool_call(call) for call in m.tool_calls]
        texts.extend(
            t for call in m.tool_calls for t in (call.id, call.function.name, call.function.arguments)
        )
    if m.role == "tool":
        if m.tool_call_id is None:
            raise invalid_request(
                "A tool message needs the tool_call_id of the call it answers.",
                param=f"messages[{i}].tool_call_id",
            )
        message["tool_call_id"] = m.tool_call_id
        texts.append(m.tool_call_id)
    return message, texts


async def admit_completion(
    req: CompletionRequest,
    tenant: Tenant,
    gw: GatewayState,
    arrival_s: float,
    idempotency_key: str | None = None,
    conversation_id: str | None = None,
) -> list[Job]:
    """One job per prompt (``prompt`` a text, token ids, or a list of either: gateway.openai.prompts), the
    first under the request's id, the others under ``<id>-<i>``."""
    target, request_id, degraded = _check_common(req, tenant, gw, "cmpl", conversation_id)
    prompts = _prompt_list(req.prompt)
    if len(prompts) > 1 and idempotency_key is not None:
        raise invalid_request(
            "An Idempotency-Key cannot be combined with several prompts; send one prompt per request.",
            param="Idempotency-Key",
            code="unsupported_parameter",
        )
    jobs = []
    for i, given in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        prompt = await _completion_prompt(given, target, gw, param)
        jobs.append(
            _job(request_id if i == 0 else f"{request_id}-{i}", target, "/v1/completions", req, tenant, gw,
                 prompt, (req.max_tokens, "max_tokens"), arrival_s, idempotency_key, degraded)
        )  # fmt: skip
    return jobs


def _prompt_list(given: str | list[str | int | list[int]]) -> list[str | list[int]]:
    """``prompt`` as its prompts: a text, token ids, or a list of texts or of token-id lists (not mixed)."""
    if isinstance(given, str):
        return [given]
    if given and all(isinstance(p, int) for p in given):
        return [[int(t) for t in given if isinstance(t, int)]]
    if not given or not (all(isinstance(p, str) for p in given) or all(isinstance(p, list) for p in given)):
        raise invalid_request(
            "prompt must be a string, token ids, or a non-empty list of strings or of token-id lists.",
            param="prompt",
        )
    if len(given) > MAX_PROMPTS:
        raise invalid_request(f"At most {MAX_PROMPTS} prompts per request, got {len(given)}.", param="prompt")
    return [p for p in given if isinstance(p, str | list)]


async def _completion_prompt(given: str | list[int], target: Target, gw: GatewayState, param: str) -> _Prompt:
    if isinstance(given, list):
        vocab = target.codec.vocab_size
        if not given or any(not 0 <= t < vocab for t in given):
            raise invalid_request(f"Prompt token ids must be in [0, {vocab}).", param=param)
        _check_prompt_tokens(len(given), gw, param)  # before decoding them for the screen
        text = await _prepare(len(given), target.codec.decode, given)
        return _Prompt(given, text, param)  # screened as the text it stands for
    _check_prompt_chars(len(given), gw, param)
    return _Prompt(await _prepare(len(given), target.codec.encode, given), given, param)


@dataclass(frozen=True)
class _Prompt:
    token_ids: list[int]
    text: str  # what the safety policy screens
    param: str  # where the request carries it: "messages" or "prompt"


async def _prepare(num_chars: int, work: Callable[[Any], Any], arg: Any) -> Any:
    """``work(arg)``: on the event loop for a small prompt, in a worker thread for a large one."""
    if num_chars < OFF_LOOP_MIN_CHARS:
        return work(arg)
    return await anyio.to_thread.run_sync(work, arg)


def _check_prompt_chars(num_chars: int, gw: GatewayState, param: str) -> None:
    limit = gw.settings.prompt_limit_chars
    if num_chars > limit:
        raise context_length_exceeded(
            f"This model's maximum prompt length is {gw.settings.max_prompt_tokens} tokens, and this gateway "
            f"accepts at most {limit} characters of prompt text. However, your prompt is {num_chars} "
            "characters.",
            param=param,
        )


def _check_prompt_tokens(num_prompt: int, gw: GatewayState, param: str = "prompt") -> None:
    if num_prompt > gw.settings.max_prompt_tokens:
        raise context_length_exceeded(
            f"This model's maximum prompt length is {gw.settings.max_prompt_tokens} tokens. "
            f"However, your prompt is {num_prompt} tokens.",
            param=param,
        )


def _check_engine_input(num_prompt: int, limits: EngineLimits | None, param: str) -> None:
    """The engine refuses a prompt over its build's max_input_len with an internal error: a 400 here."""
    if limits is not None and num_prompt > limits.max_input_len:
        raise context_length_exceeded(
            f"This model's maximum prompt length is {limits.max_input_len} tokens. "
            f"However, your prompt is {num_prompt} tokens.",
            param=param,
        )


def _context_tokens(target: Target, default: int) -> int:
    """Prompt + output tokens the version serves: its model's context, and its engine's max_seq_len."""
    context = target.codec.max_context_tokens or default
    if target.limits is not None:
        context = min(context, target.limits.max_seq_len)
    return context


def _check_common(
    req: ChatCompletionRequest | CompletionRequest,
    tenant: Tenant,
    gw: GatewayState,
    id_prefix: str,
    conversation_id: str | None,
) -> tuple[Target, str, Degraded | None]:
    """The request's checks that need no prompt, and its target: the model version that serves it (404 for
    a model the tenant may not use or routing does not know, 503 when none of its versions has a replica),
    chosen by its conversation (``X-Conversation-Id``, else ``user``, else the request alone); while the
    model is overloaded, its alias's when configured (``gateway.degradation``). Returns the target, the
    request's id and the overloaded model's fallbacks (None: not overloaded)."""
    bad = unsupported_params(req)
    if bad is not None:
        raise invalid_request(bad[1], param=bad[0], code="unsupported_parameter")
    # NOTE: every attempt has its own id, with or without an Idempotency-Key: each is billed on its own
    # ledger row (a replay answers with the stored result's id instead).
    request_id = f"{id_prefix}-{uuid.uuid4().hex}"
    key = conversation_key(conversation_id, req.user, request_id)
    target = gw.router.route(req.model, tenant, key)
    # While the model is overloaded: its fallbacks, and maybe its alias's target (gateway.degradation).
    target, degraded = gw.degradation.route(target, tenant, key, req.service_tier)
    if req.n is not None and req.n > gw.settings.max_n:
        raise out_of_range("n", req.n, gw.settings.max_n, above=True)
    stops = req.stop_strings()
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid_request(
            f"At most {MAX_STOP_STRINGS} stop strings are supported.",
            param="stop",
            code="array_above_max_length",
        )
    if any(len(stop) > MAX_STOP_CHARS for stop in stops):
        raise invalid_request(
            f"A stop string may be at most {MAX_STOP_CHARS} characters.",
            param="stop",
            code="string_above_max_length",
        )
    return target, request_id, degraded


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


MAX_LOGIT_BIAS_ENTRIES = 1024


def _sampling(
    req: ChatCompletionRequest | CompletionRequest, max_tokens: int, target: Target, guide: Guide | None
) -> Sampling:
    """The request's sampling controls, once, as every engine takes them: ``top_k`` -1 is no cut (vLLM's
    spelling), ``logit_bias`` keys are token ids of this model's vocabulary; ``guide`` (checked before)
    constrains the answer."""
    return Sampling(
        max_tokens,
        req.temperature,
        req.top_p,
        req.seed,
        req.ignore_eos,
        top_k=_top_k(req.top_k, target.codec.vocab_size),
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=_logit_bias(req.logit_bias or {}, target.codec.vocab_size),
        guide=guide,
        logprobs=_logprobs(req),
        n=req.n or 1,
        # echo with logprobs: the prompt's tokens' too (OpenAI's legacy completions)
        prompt_logprobs=isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None,
    )


def _logprobs(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """How many alternatives per token the request asks for, or None for no log-probabilities (chat:
    ``logprobs`` true and ``top_logprobs``; completions: ``logprobs`` 0-5)."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid_request("top_logprobs needs logprobs: true.", param="top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


def _top_k(top_k: int | None, vocab_size: int) -> int:
    """0 for no cut: vLLM's -1 and a k that keeps the whole vocabulary mean the same."""
    return 0 if top_k is None or top_k < 1 or top_k >= vocab_size else top_k


def _logit_bias(bias: dict[str, float], vocab_size: int) -> tuple[tuple[int, float], ...]:
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise invalid_request(
            f"logit_bias may name at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(bias)}.",
            param="logit_bias",
        )
    entries = []
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise invalid_request(
                f"logit_bias keys are token ids of this model's vocabulary (0 to {vocab_size - 1}), "
                f"got {key!r}.",
                param="logit_bias",
            )
        entries.append((token, float(value)))
    return tuple(sorted(entries))


def _max_tokens(
    asked: int | None, param: str, num_prompt: int, context: int, settings: Settings, prompt_param: str
) -> int:
    """The output budget: what the client asked, checked against the limits and the model's context, or
    the default that fits."""
    if asked is None:
        max_tokens = min(settings.default_max_tokens or settings.max_output_tokens, context - num_prompt)
        if max_tokens < 1:
            raise context_length_exceeded(
                f"This model's maximum context length is {context} tokens. However, your prompt is "
                f"{num_prompt} tokens, which leaves no room for output.",
                param=prompt_param,
            )
        return max_tokens
    if asked < 1:
        raise out_of_range(param, asked, 1, above=False)
    if asked > settings.max_output_tokens:
        raise invalid_request(
            f"{param} is too large: {asked}. This model supports at most "
            f"{settings.max_output_tokens} output tokens.",
            param=param,
            code="integer_above_max_value",
        )
    if num_prompt + asked > context:
        raise context_length_exceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{num_prompt + asked} tokens ({num_prompt} in the prompt, {asked} for the output).",
            param=prompt_param,
        )
    return asked


def _job(
    request_id: str,
    target: Target,
    route: str,
    req: ChatCompletionRequest | CompletionRequest,
    tenant: Tenant,
    gw: GatewayState,
    prompt: _Prompt,
    max_tokens_and_param: tuple[int | None, str],
    arrival_s: float,
    idempotency_key: str | None,
    degraded: Degraded | None = None,
    guide: Guide | None = None,
    tool_plan: ToolPlan | None = None,
) -> Job:
    settings = gw.settings
    token_ids = prompt.token_ids
    max_tokens, max_tokens_param = max_tokens_and_param
    num_prompt = len(token_ids)
    if num_prompt == 0:
        raise invalid_request("The prompt is empty.", param=prompt.param)
    _check_prompt_tokens(num_prompt, gw, prompt.param)
    _check_engine_input(num_prompt, target.limits, prompt.param)
    target = gw.router.for_prompt(target, num_prompt)  # the version's pool, by the prompt's length
    context = _context_tokens(target, settings.max_prompt_tokens + settings.max_output_tokens)
    max_tokens = _max_tokens(max_tokens, max_tokens_param, num_prompt, context, settings, prompt.param)
    chosen_class = request_class(req, tenant)
    # While the model is overloaded: its fallbacks (a capped max_tokens, the batch class), counted.
    max_tokens, chosen_class, degraded_as = gw.degradation.apply(
        req.model, degraded, max_tokens, chosen_class
    )
    deadline_s = (
        settings.batch_request_deadline_s
        if chosen_class is RequestClass.BATCH
        else settings.request_deadline_s
    )
    sampling = _sampling(req, max_tokens, target, guide)
    if idempotency_key is not None:
        check_key(idempotency_key)
        if sampling.n > 1 or sampling.logprobs is not None:
            # NOTE: a replay stores and returns one answer's text: refused rather than replayed short.
            raise invalid_request(
                "An Idempotency-Key cannot be combined with n > 1 or logprobs (a replay returns the text "
                "of one answer); retry without the key.",
                param="Idempotency-Key",
                code="unsupported_parameter",
            )
    return Job(
        request_id=request_id,
        route=route,
        tenant=tenant,
        model=target.model,  # an alias of an overloaded model names itself
        target=target,
        prompt_token_ids=token_ids,
        sampling=sampling,
        stop=req.stop_strings(),
        arrival_s=arrival_s,
        deadline_s=arrival_s + deadline_s,
        request_class=chosen_class,
        prompt_text=prompt.text,
        echo=isinstance(req, CompletionRequest) and req.echo,
        tool_plan=tool_plan,
        idempotency_key=idempotency_key,
        fingerprint=fingerprint(route, req) if idempotency_key is not None else "",
        degraded=degraded_as,
    )
