"""OpenAI's retention parameters, checked as OpenAI checks them: ``expires_after`` on an upload
(``POST /v1/files``, form fields ``expires_after[anchor]`` and ``expires_after[seconds]``) and
``output_expires_after`` on a batch (``POST /v1/batches``, a JSON object), both ``{"anchor": "created_at",
"seconds": N}`` with N from one hour to 30 days: the file expires N seconds after it is created. Anything
else is a 400 ``invalid_request_error`` whose ``param`` names the field."""

from __future__ import annotations

import re

import msgspec

from gateway.errors import invalid_request

ANCHORS = ("created_at",)
MIN_EXPIRES_AFTER_S = 3600  # one hour
MAX_EXPIRES_AFTER_S = 30 * 24 * 3600  # 30 days
_FORM_SECONDS = re.compile(r"^-?[0-9]{1,12}$")


class ExpiresAfter(msgspec.Struct, forbid_unknown_fields=True):
    """``output_expires_after`` in a JSON body."""

    anchor: str
    seconds: int


def checked_seconds(anchor: str, seconds: int, *, anchor_param: str, seconds_param: str) -> int:
    """``seconds`` when the pair is one OpenAI takes; else the 400 it answers."""
    if anchor not in ANCHORS:
        shown = anchor if len(anchor) <= 40 else anchor[:40] + "..."
        raise invalid_request(
            f"'{shown}' is not one of {list(ANCHORS)} - '{anchor_param}'", param=anchor_param
        )
    if not MIN_EXPIRES_AFTER_S <= seconds <= MAX_EXPIRES_AFTER_S:
        raise invalid_request(
            f"{seconds_param} must be between {MIN_EXPIRES_AFTER_S} (1 hour) and {MAX_EXPIRES_AFTER_S} "
            f"(30 days), got {seconds}.",
            param=seconds_param,
        )
    return seconds


def form_expires_after_s(anchor: str | None, seconds: str | None) -> int | None:
    """The upload's ``expires_after[anchor]`` and ``expires_after[seconds]`` (form text) as seconds; None
    when neither was sent (the file never expires); a 400 for one without the other or a bad value."""
    if anchor is None and seconds is None:
        return None
    anchor_param, seconds_param = "expires_after[anchor]", "expires_after[seconds]"
    if anchor is None:
        raise invalid_request(f"{anchor_param} is required with {seconds_param}.", param=anchor_param)
    if seconds is None:
        raise invalid_request(f"{seconds_param} is required with {anchor_param}.", param=seconds_param)
    if not _FORM_SECONDS.fullmatch(seconds):
        shown = seconds if len(seconds) <= 40 else seconds[:40] + "..."
        raise invalid_request(f"{seconds_param} must be an integer, got '{shown}'.", param=seconds_param)
    return checked_seconds(anchor, int(seconds), anchor_param=anchor_param, seconds_param=seconds_param)


def output_expires_after_s(value: ExpiresAfter | None) -> int | None:
    """A batch's ``output_expires_after`` as seconds; None when not sent (its result files never expire)."""
    if value is None:
        return None
    return checked_seconds(
        value.anchor,
        value.seconds,
        anchor_param="output_expires_after.anchor",
        seconds_param="output_expires_after.seconds",
    )
