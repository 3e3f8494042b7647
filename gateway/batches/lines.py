"""An input file's lines, parsed and checked before any runs: each is a request to run (``BatchLine``)
or a problem reported in the batch's error file (``LineProblem``); a problem with the file as a whole
fails the batch (``FileProblem``). Pure: no I/O.

A line is OpenAI's ``{"custom_id": "...", "method": "POST", "url": "<the batch's endpoint>", "body":
{...}}``. Its body is checked here as the endpoint's request type (unknown fields refused, no streaming);
what needs the model and the tenant (limits, the prompt's length) is checked when it runs, by the same
admission as an interactive call.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from gateway.openai.body import MAX_JSON_DEPTH, json_nesting_exceeds
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, first_unknown_field
from sluice.stores.batches.base import BatchError

ENDPOINTS: dict[str, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
}
MAX_CUSTOM_ID_CHARS = 256
MAX_SHOWN_NAME_CHARS = 64  # of an unknown field's name, quoted in the line's error
# Validation errors listed on a failed batch (OpenAI's ``errors.data``); the rest are counted in the last.
MAX_FILE_ERRORS = 20

_LINE_FIELDS = frozenset({"custom_id", "method", "url", "body"})


@dataclass(frozen=True)
class BatchLine:
    index: int  # 0-based line of the input file (blank lines count)
    custom_id: str
    body: ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True)
class LineProblem:
    """A line that cannot run: reported in the error file, counted as failed, never billed."""

    index: int
    custom_id: str | None  # None: the line has no readable custom_id
    code: str
    message: str


@dataclass(frozen=True)
class ParsedFile:
    lines: list[BatchLine]
    problems: list[LineProblem]
    errors: tuple[BatchError, ...]  # non-empty: the batch fails and nothing runs

    @property
    def total(self) -> int:
        return len(self.lines) + len(self.problems)


def parse_input(data: bytes, endpoint: str, max_lines: int, max_line_bytes: int | None = None) -> ParsedFile:
    """Every non-blank line of ``data`` (JSONL) as a line to run or a problem. The file fails as a whole
    when it is not UTF-8, holds no line, more than ``max_lines``, or two lines share a ``custom_id`` (each
    line's usage row is keyed by it). ``max_line_bytes``: a longer line is a problem (``line_too_large``),
    not parsed: the runner passes the JSON body limit of an interactive call (``SLUICE_MAX_BODY_BYTES``),
    so a line is held to what the same request sent alone would be."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _failed(BatchError("invalid_file", f"The input file is not UTF-8 text: {exc.reason}."))
    raw_lines = text.splitlines()
    numbered = [(i, line) for i, line in enumerate(raw_lines) if line.strip()]
    if not numbered:
        return _failed(BatchError("empty_file", "The input file has no request lines."))
    if len(numbered) > max_lines:
        return _failed(
            BatchError(
                "too_many_requests",
                f"The input file has {len(numbered)} request lines; a batch may have at most {max_lines}.",
            )
        )
    lines: list[BatchLine] = []
    problems: list[LineProblem] = []
    first_line_of: dict[str, int] = {}
    duplicates: list[BatchError] = []
    for index, raw in numbered:
        parsed = _too_large(index, raw, max_line_bytes) or parse_line(index, raw, endpoint)
        custom_id = parsed.custom_id
        if custom_id is not None:
            if custom_id in first_line_of:
                duplicates.append(
                    BatchError(
                        "duplicate_custom_id",
                        f"custom_id {custom_id!r} is also on line {first_line_of[custom_id] + 1}; each "
                        "line needs its own.",
                        line=index + 1,
                        param="custom_id",
                    )
                )
                continue
            first_line_of[custom_id] = index
        if isinstance(parsed, BatchLine):
            lines.append(parsed)
        else:
            problems.append(parsed)
    if duplicates:
        return ParsedFile([], [], _capped(duplicates))
    return ParsedFile(lines, problems, ())


def parse_line(index: int, raw: str, endpoint: str) -> BatchLine | LineProblem:
    """One line: a request to run, or why it cannot run."""
    if json_nesting_exceeds(raw.encode()):
        message = f"The line nests JSON more than {MAX_JSON_DEPTH} levels deep."
        return LineProblem(index, None, "invalid_json_line", message)
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        return LineProblem(index, None, "invalid_json_line", f"The line is not valid JSON: {exc}.")
    if not isinstance(obj, dict):
        return LineProblem(index, None, "invalid_json_line", "The line is not a JSON object.")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        message = f"custom_id must be a string of 1 to {MAX_CUSTOM_ID_CHARS} characters."
        return LineProblem(index, None, "invalid_custom_id", message)

    def problem(code: str, message: str) -> LineProblem:
        return LineProblem(index, custom_id, code, message)

    unknown = sorted(set(obj) - _LINE_FIELDS)
    if unknown:
        return problem("invalid_request", f"Unrecognized field on the line: {_shown(unknown[0])}.")
    if obj.get("method") != "POST":
        return problem("invalid_method", 'method must be "POST".')
    if obj.get("url") != endpoint:
        return problem("mismatched_url", f"url must be the batch's endpoint, {endpoint!r}.")
    body = obj.get("body")
    if not isinstance(body, dict):
        return problem("invalid_request", "body must be a JSON object (the request).")
    request_type = ENDPOINTS[endpoint]
    unknown_field = first_unknown_field(body, request_type)
    if unknown_field is not None:
        message = f"Unrecognized request argument supplied: {_shown(unknown_field)}."
        return problem("invalid_request", message)
    try:
        request = msgspec.convert(body, request_type)
    except msgspec.ValidationError as exc:
        return problem("invalid_request", f"Invalid request body: {exc}.")
    if request.stream:
        return problem("invalid_request", "stream is not supported in a batch.")
    return BatchLine(index, custom_id, request)


def _shown(name: str) -> str:
    """A field name the line chose, as an error message quotes it: cut at ``MAX_SHOWN_NAME_CHARS``, so an
    error line never echoes a huge key back (every line of a file could carry one)."""
    return name if len(name) <= MAX_SHOWN_NAME_CHARS else name[:MAX_SHOWN_NAME_CHARS] + "..."


def _too_large(index: int, raw: str, max_line_bytes: int | None) -> LineProblem | None:
    """The problem of a line over ``max_line_bytes`` (its custom_id unread: the line is not parsed)."""
    if max_line_bytes is None or len(raw) * 4 <= max_line_bytes:  # NOTE: 4 bytes at most per character
        return None
    num_bytes = len(raw.encode("utf-8"))
    if num_bytes <= max_line_bytes:
        return None
    message = f"The line is {num_bytes} bytes; a request line may be at most {max_line_bytes} bytes."
    return LineProblem(index, None, "line_too_large", message)


def _failed(error: BatchError) -> ParsedFile:
    return ParsedFile([], [], (error,))


def _capped(errors: list[BatchError]) -> tuple[BatchError, ...]:
    if len(errors) <= MAX_FILE_ERRORS:
        return tuple(errors)
    shown = errors[: MAX_FILE_ERRORS - 1]
    rest = errors[MAX_FILE_ERRORS - 1 :]
    first = rest[0]
    summary = BatchError(
        first.code, f"{first.message} (and {len(rest) - 1} more like it)", first.line, first.param
    )
    return (*shown, summary)
