"""What the weight store tests observe and break: a log of the ranged GETs a real boto3 client sends to
moto, and a client that is cut off after a number of ranged GETs (a named fake interruption: the network
or the process dying mid-download)."""

from __future__ import annotations

import threading
from typing import Any


class RangedGetLog:
    """Every GetObject with a Range that ``client`` sends: (key, range) in order. Whole-object GETs (the
    manifest) are counted apart in ``num_whole_gets``."""

    def __init__(self, client: Any) -> None:
        self._lock = threading.Lock()
        self.ranged: list[tuple[str, str]] = []
        self.num_whole_gets = 0
        client.meta.events.register("provide-client-params.s3.GetObject", self._record)

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        with self._lock:
            if "Range" in params:
                self.ranged.append((params["Key"], params["Range"]))
            else:
                self.num_whole_gets += 1

    def fetched_keys(self) -> set[str]:
        return {key for key, _ in self.ranged}


class SimulatedInterruption(Exception):
    """The fake cut-off: raised by InterruptingClient instead of the request (as a process kill would
    end it: not a store error the fetch could retry)."""


class InterruptingClient:
    """A real client whose ranged GETs after the first ``num_allowed`` fail with SimulatedInterruption;
    ``completed`` lists the (key, range) of those that went through. Everything else is delegated."""

    def __init__(self, client: Any, num_allowed: int) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._num_left = num_allowed
        self.completed: list[tuple[str, str]] = []

    def get_object(self, **params: Any) -> Any:
        if "Range" in params:
            with self._lock:
                if self._num_left <= 0:
                    raise SimulatedInterruption(f"simulated cut-off before {params['Key']} {params['Range']}")
                self._num_left -= 1
            response = self._client.get_object(**params)
            with self._lock:
                self.completed.append((params["Key"], params["Range"]))
            return response
        return self._client.get_object(**params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _BrokenBody:
    def __init__(self, body: Any) -> None:
        self._body = body

    def read(self, *args: Any) -> bytes:
        from botocore.exceptions import ResponseStreamingError

        self._body.read(1)
        raise ResponseStreamingError(error="simulated: connection reset while the body streamed")


class DroppingBodiesClient:
    """A real client whose first ``num_broken`` ranged responses break while their body streams (a
    connection reset mid-part, the failure botocore does not retry). Everything else is delegated."""

    def __init__(self, client: Any, num_broken: int) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._num_left = num_broken

    def get_object(self, **params: Any) -> Any:
        response = self._client.get_object(**params)
        with self._lock:
            broken = "Range" in params and self._num_left > 0
            self._num_left -= broken
        if broken:
            response["Body"] = _BrokenBody(response["Body"])
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
