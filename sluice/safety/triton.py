"""A classifier served as another Triton model, called over the same gRPC client as generation.

The model takes one BYTES tensor ``text`` (shape [1], UTF-8) and returns ``blocked`` (BOOL, [1]) and
``category`` (BYTES, [1]; "" when allowed). In production that model would be a Llama Guard deployment
behind a thin adapter; in development ``model_repository/safety_classifier`` serves the built-in rules
under that contract (``replicas.render.render_safety_classifier``).

Fails loudly: an unreachable server, a timeout or a malformed reply raise
``ClassifierUnavailableError``, and the caller decides whether that blocks the request.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from sluice.safety.base import Classifier, ClassifierUnavailableError, Verdict
from sluice.triton.client import to_infer_inputs

OUTPUT_NAMES = ("blocked", "category")


def text_tensors(text: str) -> dict[str, np.ndarray]:
    """The request tensors for one text."""
    return {"text": np.array([text.encode("utf-8")], dtype=np.object_)}


def verdict_from_result(result: Any, classifier: str) -> Verdict:
    """Decode one ``InferResult``; ``ValueError`` if it lacks the outputs or they are malformed."""
    blocked = result.as_numpy("blocked")
    category = result.as_numpy("category")
    if blocked is None or category is None or blocked.size != 1 or category.size != 1:
        raise ValueError("the reply lacks one-element `blocked` and `category` outputs")
    raw = category.reshape(-1)[0]
    name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if not bool(blocked.reshape(-1)[0]):
        return Verdict.allow(classifier)
    return Verdict.block(classifier, name or "unsafe")


class TritonClassifier(Classifier):
    """``classify`` only (remote, awaited): screens prompts, not every streamed chunk.

    The gRPC client is made on first use (inside the running event loop) unless one is given; one
    instance may serve every request and every policy concurrently.
    """

    def __init__(
        self,
        url: str | None = None,
        model_name: str = "sluice-guard",
        timeout_s: float = 5.0,
        client: grpcclient.InferenceServerClient | None = None,
    ) -> None:
        if url is None and client is None:
            raise ValueError("give the Triton gRPC url (host:port) or a client")
        self.name = f"triton:{model_name}"
        self.model_name = model_name
        self._url = url
        self._timeout_s = timeout_s
        self._client = client
        self._owns_client = client is None
        self._outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES]

    def _get_client(self) -> grpcclient.InferenceServerClient:
        if self._client is None:
            self._client = grpcclient.InferenceServerClient(str(self._url))
        return self._client

    async def classify(self, text: str) -> Verdict:
        try:
            result = await self._get_client().infer(
                self.model_name,
                to_infer_inputs(text_tensors(text)),
                outputs=self._outputs,
                client_timeout=self._timeout_s,
            )
            return verdict_from_result(result, self.name)
        except (InferenceServerException, ValueError) as exc:
            raise ClassifierUnavailableError(f"{self.name}: {exc}") from exc

    async def close(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.close()
        self._client = None if self._owns_client else self._client
