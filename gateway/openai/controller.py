"""POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

Streaming responses are SSE (``data: {chunk}`` lines, ending ``data: [DONE]``). The first event is
awaited before the response starts, so an engine refusal before any token is a proper HTTP error; an
error after tokens were sent ends the stream with ``data: {"error": {...}}``. Litestar's ``Stream``
runs the body in a task group that cancels it on ``http.disconnect``; non-streaming requests watch for
the disconnect themselves. Either way the cancellation lands in ``generate_text``'s ``finally``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import anyio
import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath, HeaderParameter, JSONBody
from litestar.response import Stream

from gateway.auth import require_tenant, tenant_of
from gateway.errors import (
    OpenAIError,
    content_filtered,
    error_responses,
    invalid_field,
    invalid_request,
    model_not_found,
)
from gateway.openai.admission import admit_chat, admit_completion
from gateway.openai.body import BoundedJSONRequest
from gateway.openai.generation import generate_text
from gateway.openai.job import Event, FinishEvent, Job, QuotaTaken, TextEvent, Timing, TokenLogprobs
from gateway.openai.logprobs import CompletionLogprobsWriter, chat_logprobs
from gateway.openai.prompts import merged
from gateway.openai.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatLogprobs,
    ChoiceDelta,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    Model,
    ModelList,
    ResponseMessage,
    Usage,
    first_unknown_field,
    parameters_doc,
)
from gateway.openai.tools import Part, ToolCallReader, delta_tool_call, read_whole
from gateway.scheduling.quota_gate import rate_limit_headers
from gateway.state import GatewayState
from sluice.engine_client import EngineError, EngineErrorKind, TokenLogprob

_ENCODER = msgspec.json.Encoder()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def engine_http_error(exc: EngineError) -> OpenAIError:
    if exc.kind is EngineErrorKind.INVALID_REQUEST:
        return OpenAIError(400, f"The replica refused the request: {exc.message}")
    if exc.kind is EngineErrorKind.UNAVAILABLE:
        return OpenAIError(
            503,
            "The model replica is unavailable; retry later.",
            type="server_error",
            code="replica_unavailable",
        )
    return OpenAIError(
        500, f"The model replica failed: {exc.message}", type="server_error", code="engine_error"
    )


def _sse(obj: Any) -> bytes:
    return b"data: " + _ENCODER.encode(obj) + b"\n\n"


# A text that stands for a chunk's text while its framing is cut out (``_text_frame``): encoded, it is
# itself (no character JSON escapes), and no id, model or fingerprint holds it.
_MARK = "\ue000sluice-chunk-text\ue001"


def _text_frame(chunk: Any) -> tuple[bytes, bytes]:
    """The SSE bytes of ``chunk`` (whose text is ``_MARK``) before and after its encoded text: a stream's
    text chunks differ only there, so each is framing + the text's JSON string + framing, without a
    chunk object per token."""
    before, mark, after = _sse(chunk).partition(_ENCODER.encode(_MARK))
    assert mark and _ENCODER.encode(_MARK) not in after, "the chunk's text must appear in it exactly once"
    return before, after


def _usage(finish: FinishEvent) -> Usage:
    return Usage(finish.prompt_tokens, finish.output_tokens, finish.prompt_tokens + finish.output_tokens)


@dataclass
class Answer:
    """One answer of a whole (non-streamed) response: its text and its tokens' log-probabilities."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()

    @property
    def text(self) -> str:
        return "".join(self.parts)


def collect(answers: dict[int, Answer], event: TextEvent) -> None:
    answer = answers.setdefault(event.index, Answer())
    answer.parts.append(event.text)
    answer.logprobs.extend(event.logprobs)
    answer.prompt_logprobs = event.prompt_logprobs or answer.prompt_logprobs


# ----- per-endpoint chunk shapes -----
class ChatShape:
    def __init__(self, job: Job) -> None:
        self.job = job
        self._frame: tuple[bytes, bytes] | None = None
        # With tools: each answer's text is read for calls (gateway.openai.tools), one reader per answer.
        self._readers: dict[int, ToolCallReader] = {}
        self._held_logprobs: dict[int, list[TokenLogprobs]] = {}

    def _reader(self, index: int) -> ToolCallReader | None:
        plan = self.job.tool_plan
        if plan is None:
            return None
        if index not in self._readers:
            self._readers[index] = plan.reader()
        return self._readers[index]

    def _parts_sse(self, index: int, parts: list[Part], logprobs: Sequence[TokenLogprobs]) -> bytes:
        """The chunks of an answer's parts (content, tool-call deltas); the log-probabilities go with the
        first chunk, or wait for the next one when there is none yet (text held back)."""
        held = self._held_logprobs.setdefault(index, [])
        held.extend(logprobs)
        out = []
        for part in parts:
            delta = (
                ChoiceDelta(content=part)
                if isinstance(part, str)
                else ChoiceDelta(tool_calls=[delta_tool_call(part)])
            )
            out.append(_sse(self._chunk(delta, None, index, self._logprobs(held) if held else None)))
            held.clear()
        return b"".join(out)

    def _chunk(
        self, delta: ChoiceDelta, finish_reason: str | None = None, index: int = 0, logprobs: Any = None
    ) -> ChatCompletionChunk:
        job = self.job
        return ChatCompletionChunk(
            job.request_id,
            job.created,
            job.model,
            [ChatChunkChoice(index, delta, finish_reason, logprobs)],
            system_fingerprint=job.system_fingerprint,
        )

    def _logprobs(self, entries: Sequence[TokenLogprobs]) -> ChatLogprobs | None:
        asked = self.job.sampling.logprobs is not None
        return chat_logprobs(self.job.target.codec, entries) if asked else None

    def opening(self) -> list[Any]:
        return [
            self._chunk(ChoiceDelta(role="assistant", content=""), index=i)
            for i in range(self.job.sampling.n)
        ]

    def text(self, event: TextEvent) -> Any:
        return self._chunk(ChoiceDelta(content=event.text), None, event.index, self._logprobs(event.logprobs))

    def text_sse(self, event: TextEvent) -> bytes:
        """``_sse(self.text(event))``, byte for byte; the first answer's plain text from this stream's
        framing around the text. With tools, the chunks of what the answer's reader makes of it (maybe
        none while it holds text back)."""
        reader = self._reader(event.index)
        if reader is not None:
            return self._parts_sse(event.index, reader.feed(event.text), event.logprobs)
        if event.index or self.job.sampling.logprobs is not None:
            return _sse(self.text(event))
        if self._frame is None:
            self._frame = _text_frame(self.text(TextEvent(_MARK)))
        return self._frame[0] + _ENCODER.encode(event.text) + self._frame[1]

    def finish_sse(self, finish: FinishEvent) -> bytes:
        """Each answer's end: what its reader still held (with tools), then its finish chunk."""
        out = []
        for i in range(self.job.sampling.n):
            reason = finish.reason_of(i)
            reader = self._reader(i)
            if reader is not None:
                out.append(self._parts_sse(i, reader.finish(), ()))
                reason = reader.finish_reason(reason)
            out.append(_sse(self._chunk(ChoiceDelta(), reason, i)))
        return b"".join(out)

    def usage(self, finish: FinishEvent) -> Any:
        job = self.job
        return ChatCompletionChunk(
            job.request_id,
            job.created,
            job.model,
            [],
            usage=_usage(finish),
            system_fingerprint=job.system_fingerprint,
        )

    def whole(self, answers: dict[int, Answer], finish: FinishEvent) -> Any:
        job = self.job
        choices = []
        for i in range(job.sampling.n):
            answer = answers.get(i, Answer())
            reason = finish.reason_of(i)
            if job.tool_plan is not None:
                reader = job.tool_plan.reader()
                content, calls = read_whole(reader, answer.text)
                message = ResponseMessage("assistant", content, calls or None)
                reason = reader.finish_reason(reason)
            else:
                message = ResponseMessage("assistant", answer.text)
            choices.append(ChatChoice(i, message, reason, self._logprobs(answer.logprobs)))
        return ChatCompletion(
            job.request_id,
            job.created,
            job.model,
            choices,
            _usage(finish),
            system_fingerprint=job.system_fingerprint,
        )


class CompletionShape:
    """``jobs``: one per prompt; prompt i's answer j is choice ``i * n + j`` (gateway.openai.prompts)."""

    def __init__(self, jobs: list[Job]) -> None:
        self.job = jobs[0]
        self._prompts = [job.prompt_text for job in jobs]
        self._prompt_ids = [job.prompt_token_ids for job in jobs]
        self.num_choices = len(jobs) * self.job.sampling.n
        self._frame: tuple[bytes, bytes] | None = None
        self._writers: dict[int, CompletionLogprobsWriter] = {}

    def _prompt_of(self, choice: int) -> str:
        return self._prompts[choice // self.job.sampling.n]

    def _chunk(
        self, text: str, finish_reason: str | None = None, index: int = 0, logprobs: Any = None
    ) -> Completion:
        job = self.job
        return Completion(
            job.request_id,
            job.created,
            job.model,
            [CompletionChoice(index, text, finish_reason, logprobs)],
            system_fingerprint=job.system_fingerprint,
        )

    def _logprobs(
        self, index: int, entries: Sequence[TokenLogprobs], prompt: Sequence[TokenLogprob] = ()
    ) -> CompletionLogprobs | None:
        """The chunk's log-probabilities; with echo, the prompt's first (its first token has none)."""
        if self.job.sampling.logprobs is None:
            return None
        writer = self._writers.setdefault(index, CompletionLogprobsWriter(self.job.target.codec))
        if prompt:
            ids = self._prompt_ids[index // self.job.sampling.n]
            return writer([(ids[0], None), *zip(ids[1:], prompt, strict=True), *entries])
        return writer(entries)

    def opening(self) -> list[Any]:
        """With ``echo``, the prompt, as each answer's first chunk."""
        if not self.job.echo:
            return []
        return [self._chunk(self._prompt_of(i), index=i) for i in range(self.num_choices)]

    def text(self, event: TextEvent) -> Any:
        logprobs = self._logprobs(event.index, event.logprobs, event.prompt_logprobs)
        return self._chunk(event.text, None, event.index, logprobs)

    def text_sse(self, event: TextEvent) -> bytes:
        """``_sse(self.text(event))``, byte for byte; the first answer's plain text from this stream's
        framing around the text."""
        if event.index or self.job.sampling.logprobs is not None:
            return _sse(self.text(event))
        if self._frame is None:
            self._frame = _text_frame(self.text(TextEvent(_MARK)))
        return self._frame[0] + _ENCODER.encode(event.text) + self._frame[1]

    def finish_sse(self, finish: FinishEvent) -> bytes:
        return b"".join(_sse(self._chunk("", finish.reason_of(i), i)) for i in range(self.num_choices))

    def usage(self, finish: FinishEvent) -> Any:
        job = self.job
        return Completion(
            job.request_id,
            job.created,
            job.model,
            [],
            usage=_usage(finish),
            system_fingerprint=job.system_fingerprint,
        )

    def whole(self, answers: dict[int, Answer], finish: FinishEvent) -> Any:
        job = self.job
        choices = []
        for i in range(self.num_choices):
            answer = answers.get(i, Answer())
            text = self._prompt_of(i) + answer.text if job.echo else answer.text
            logprobs = self._logprobs(i, answer.logprobs, answer.prompt_logprobs)
            choices.append(CompletionChoice(i, text, finish.reason_of(i), logprobs))
        return Completion(
            job.request_id,
            job.created,
            job.model,
            choices,
            usage=_usage(finish),
            system_fingerprint=job.system_fingerprint,
        )


Shape = ChatShape | CompletionShape


async def _respond(
    request: Request[Any, Any, Any], jobs: list[Job], shape: Shape, stream: bool, include_usage: bool
) -> Response[Any] | Stream:
    """``jobs``: one per prompt (several only for a completions request with a list of prompts); the
    response's timing and rate-limit headers are the first's."""
    gw: GatewayState = request.app.state.gw
    job = jobs[0]
    timing = Timing(job.arrival_s)
    quota_taken = QuotaTaken()
    collected = not stream  # the whole answer goes back at once: a lost replica is replaced until the end
    streams = [generate_text(job, gw, timing, quota_taken, collected=collected)]
    streams += [generate_text(o, gw, Timing(o.arrival_s), collected=collected) for o in jobs[1:]]
    events = merged(streams, job.sampling.n)
    try:
        if stream:
            return await _stream(request, events, shape, include_usage, timing, quota_taken)
        async with aclosing(events):
            return await _whole(request, events, shape, timing, quota_taken)
    except OpenAIError as exc:
        exc.request_id = job.request_id
        raise


async def _stream(
    request: Request[Any, Any, Any],
    events: AsyncGenerator[Event, None],
    shape: Shape,
    include_usage: bool,
    timing: Timing,
    quota_taken: QuotaTaken,
) -> Response[Any] | Stream:
    first: Event | None = None

    async def prime() -> None:
        nonlocal first
        first = await anext(events)

    try:
        # NOTE: waiting for the first token (queue + prefill) also watches for the client leaving.
        if not await _until_disconnect(request, prime):
            await events.aclose()
            return Response(b"", status_code=499)  # nobody reads it
    except EngineError as exc:
        await events.aclose()
        err = engine_http_error(exc)
        err.counted = True  # generate_text's finally counted it
        raise err from None
    except BaseException:
        await events.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        # NOTE: one write per batch of chunks ready together: the opening with the first event, and the
        # finish, usage and [DONE] (or the filter's error event) as one.
        async with aclosing(events):
            ready = [_sse(chunk) for chunk in shape.opening()]
            assert first is not None
            event: Event = first
            try:
                while True:
                    if isinstance(event, TextEvent):
                        chunk = shape.text_sse(event)
                        if ready:
                            ready.append(chunk)
                            chunk = b"".join(ready)
                            ready.clear()
                        if chunk:  # with tools, text a reader holds back makes no chunk yet
                            yield chunk
                    else:
                        ready.append(shape.finish_sse(event))
                        if include_usage:
                            ready.append(_sse(shape.usage(event)))
                        if event.filter_message is not None:  # the terminal event of a filtered stream
                            ready.append(_sse(content_filtered(event.filter_message).body()))
                        else:
                            ready.append(b"data: [DONE]\n\n")
                        yield b"".join(ready)
                        return
                    event = await anext(events)
            except EngineError as exc:
                ready.append(_sse(engine_http_error(exc).body()))  # after tokens: an error event, not a close
                yield b"".join(ready)

    headers = {**_SSE_HEADERS, **_request_headers(shape.job, timing, quota_taken)}
    return Stream(body(), media_type="text/event-stream", headers=headers)


async def _whole(
    request: Request[Any, Any, Any],
    events: AsyncGenerator[Event, None],
    shape: Shape,
    timing: Timing,
    quota_taken: QuotaTaken,
) -> Response[Any]:
    answers: dict[int, Answer] = {}
    finish: FinishEvent | None = None

    async def read_all() -> None:
        nonlocal finish
        async for event in events:
            if isinstance(event, TextEvent):
                collect(answers, event)
            else:
                finish = event

    try:
        await _until_disconnect(request, read_all)
    except EngineError as exc:
        err = engine_http_error(exc)
        err.counted = True  # generate_text's finally counted it
        raise err from None
    if finish is None:  # the client went away; nobody reads this
        return Response(b"", status_code=499)
    headers = _request_headers(shape.job, timing, quota_taken)
    return Response(shape.whole(answers, finish), headers=headers)


def _request_headers(job: Job, timing: Timing, quota_taken: QuotaTaken) -> dict[str, str]:
    # Server-Timing splits the time to the first token into the gateway's part and the replica's.
    headers = {
        "X-Request-Id": job.request_id,
        "Server-Timing": timing.server_timing(),
        "Sluice-Model-Version": job.model_version,
    }
    if job.degraded:  # the fallbacks its overloaded model imposed (gateway.degradation)
        headers["Sluice-Degraded"] = job.degraded
    if (
        quota_taken.grant is not None
    ):  # the tenant's token bucket as its acquire left it, read in that acquire
        headers |= rate_limit_headers(job.tenant, quota_taken.grant.remaining_tokens)
    return headers


async def _until_disconnect(request: Request[Any, Any, Any], work: Callable[[], Awaitable[Any]]) -> bool:
    """Run ``work``, cancelling it if the client disconnects first (the body is already read).

    True if ``work`` ran to its end; False if the client left. ``work``'s own errors propagate as they
    are (not wrapped in an ExceptionGroup), so the caller can map them.
    """
    error: Exception | None = None
    completed = False
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    group.cancel_scope.cancel()
                    return

        group.start_soon(watch)
        try:
            await work()
            completed = True
        except Exception as exc:
            error = exc
        group.cancel_scope.cancel()
    if error is not None:
        raise error
    return completed


ConversationId = Annotated[
    str | None,
    HeaderParameter(
        name="X-Conversation-Id",
        required=False,
        max_length=256,
        description="Keeps a conversation on one model version during a rollout (else the body's `user`, "
        "else each request on its own).",
    ),
]

IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        required=False,
        description="Retry safely: one generation and one bill per key (per tenant); see the notes.",
    ),
]

_RETRIES = (
    "Retries with an `Idempotency-Key` header: if an earlier attempt with the key finished, its result is "
    "replayed (as SSE when streaming) without generating or billing again; while one runs, 409 "
    "`idempotency_key_in_progress`; the key with a different body, 422 `idempotency_key_reused`. After a "
    "failed or cancelled attempt the retry STARTS OVER (it does not resume the stream) as a new request "
    "with its own id. Every attempt that reached a replica is billed for the tokens it produced, on its "
    "own usage row carrying the key and the attempt number; only a replay is free. The idempotency store "
    "unavailable: 503 `idempotency_store_unavailable` with `Retry-After` (requests without a key go on). "
    "Refusals before any work: 400 `content_filter` (the prompt), 429 `tokens_per_minute_exceeded` / "
    "`concurrent_requests_exceeded` / `service_overloaded` with `Retry-After` and `retry-after-ms`. A "
    'stream the output filter stops ends with `finish_reason: "content_filter"` and an error event.'
)


S = TypeVar("S", bound=msgspec.Struct)


async def _strict_body(request: Request[Any, Any, Any], struct: type[S]) -> S:
    """The body as ``struct``, decoded strictly, as OpenAI reads it: a string where a number belongs is a
    400 naming the field (Litestar's own conversion is lax: it turns "10" into 10). A field the type does
    not declare is 400 ``unknown_parameter`` (OpenAI's "Unrecognized request argument"): silently
    ignoring it could change what the caller gets."""
    raw = await request.json()  # the decoded body, cached
    unknown = first_unknown_field(raw, struct)
    if unknown is not None:
        raise invalid_request(
            f"Unrecognized request argument supplied: {unknown}. See the API docs for the parameters "
            "Sluice serves, accepts and ignores, or refuses.",
            param=unknown,
            code="unknown_parameter",
        )
    try:
        return msgspec.convert(raw, struct, strict=True)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        raise invalid_field(message, where.rstrip("`").lstrip(".")) from None


_COMPLETION_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 422, 429, 503)


class OpenAIController(Controller):
    path = "/v1"
    guards = [require_tenant]  # noqa: RUF012 — Litestar's declaration style
    tags = ["OpenAI"]  # noqa: RUF012
    request_class = BoundedJSONRequest  # refuses JSON nested deeper than MAX_JSON_DEPTH, before decoding

    @post(
        "/chat/completions",
        status_code=200,
        description=f"{parameters_doc(chat=True)}\n\n{_RETRIES}",
        responses=_COMPLETION_ERRORS,
    )
    async def chat_completions(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[ChatCompletionRequest],
        key: IdempotencyKey = None,
        conversation: ConversationId = None,
    ) -> Response[ChatCompletion] | Stream:
        """Chat completion; ``stream: true`` streams ``chat.completion.chunk`` events."""
        gw: GatewayState = request.app.state.gw
        data = await _strict_body(request, ChatCompletionRequest)
        job = await admit_chat(data, tenant_of(request), gw, request.state.arrival_s, key, conversation)
        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        return await _respond(request, [job], ChatShape(job), data.stream, include_usage)

    @post(
        "/completions",
        status_code=200,
        description=f"{parameters_doc(chat=False)}\n\n{_RETRIES}",
        responses=_COMPLETION_ERRORS,
    )
    async def completions(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[CompletionRequest],
        key: IdempotencyKey = None,
        conversation: ConversationId = None,
    ) -> Response[Completion] | Stream:
        """Text completion; ``stream: true`` streams ``text_completion`` events."""
        gw: GatewayState = request.app.state.gw
        data = await _strict_body(request, CompletionRequest)
        jobs = await admit_completion(
            data, tenant_of(request), gw, request.state.arrival_s, key, conversation
        )
        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        return await _respond(request, jobs, CompletionShape(jobs), data.stream, include_usage)

    @get("/models", responses=error_responses(401, 503))
    async def models(self, request: Request[Any, Any, Any]) -> ModelList:
        gw: GatewayState = request.app.state.gw
        return ModelList([Model(name, 0, "sluice") for name in gw.router.models_for(tenant_of(request))])

    @get("/models/{model:str}", responses=error_responses(401, 404, 503))
    async def retrieve_model(self, request: Request[Any, Any, Any], model: FromPath[str]) -> Model:
        """One model this key may call (``client.models.retrieve``); 404 ``model_not_found`` otherwise,
        as for a model the key may not call (its name is not confirmed to other tenants)."""
        gw: GatewayState = request.app.state.gw
        if model not in gw.router.models_for(tenant_of(request)):
            raise model_not_found(model if len(model) <= 128 else model[:128] + "...")
        return Model(model, 0, "sluice")
