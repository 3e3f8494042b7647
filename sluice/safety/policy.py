"""Named safety policies: which classifiers screen a tenant's prompts and which its streamed output.

Built in (``BUILTIN_POLICIES``): ``none`` (nothing), ``default`` (the configured block list and regexes
on input and output: an ordinary prompt, an e-mail address or a card number in it, is served, as every
peer serves it), ``pii`` (those and the PII rules: a tenant opts into refusing personal data), ``strict``
(the rules, PII included, and the Triton classifier on input; the rules on output). A safety config may
add more (``SafetyConfig.policies``); each tenant names one (``Tenant.safety_policy``). A rules group
with nothing configured in it (no block list, no regexes) screens nothing, so it holds no text back.

    config = load_safety_config(settings.safety_config_path)
    policies = build_policies(config, triton_url=settings.triton_grpc_url,
                              classifier_model=settings.safety_classifier_model)
    policy = policies[tenant.safety_policy]
    if (verdict := await policy.screen_input(prompt)) is not None: ...  # 400 content_filter
    screen = policy.output_screen(settings.safety_holdback_chars)  # None: output is not screened
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio.to_thread

from sluice.safety.base import Classifier, Verdict
from sluice.safety.config import BUILTIN_POLICY_NAMES, ClassifierRef, PolicySpec, SafetyConfig, policy_names
from sluice.safety.rules import RulesClassifier, build_rules
from sluice.safety.stream import StreamScreen
from sluice.safety.triton import TritonClassifier

BUILTIN_POLICIES: dict[str, PolicySpec] = {
    "none": PolicySpec(),
    "default": PolicySpec(input=("content",), output=("content",)),
    "pii": PolicySpec(input=("rules",), output=("rules",)),
    "strict": PolicySpec(input=("rules", "triton"), output=("rules",)),
}
if tuple(BUILTIN_POLICIES) != BUILTIN_POLICY_NAMES:  # policy_names() lists the config module's names
    raise RuntimeError("BUILTIN_POLICIES and config.BUILTIN_POLICY_NAMES disagree")


# A prompt longer than this is screened in a worker thread, fed to a StreamScreen in pieces of this size:
# `re` holds the GIL for a whole search (~45 ms on 1 MiB), a piece only ~1 ms, so the event loop keeps
# running between pieces; the screen's holdback makes the pieces decide as the whole text would.
PIECE_CHARS = 16 * 1024


class UnknownPolicyError(LookupError):
    pass


@dataclass(frozen=True)
class SafetyPolicy:
    name: str
    input_classifiers: tuple[Classifier, ...]
    output_classifiers: tuple[Classifier, ...]  # all synchronous (supports_streaming)

    async def screen_input(self, text: str) -> Verdict | None:
        """The first blocking verdict on a prompt, or None. Synchronous classifiers run first, so a
        prompt the rules block never costs a remote call. Remote failures raise
        ``ClassifierUnavailableError``."""
        for classifier in sorted(self.input_classifiers, key=lambda c: not c.supports_streaming):
            if classifier.supports_streaming and len(text) <= PIECE_CHARS:
                verdict = classifier.classify_now(text)
            elif classifier.supports_streaming:
                verdict = await anyio.to_thread.run_sync(_screen_in_pieces, classifier, text)
            else:
                verdict = await classifier.classify(text)
            if verdict.blocked:
                return verdict
        return None

    @property
    def screens_output(self) -> bool:
        return bool(self.output_classifiers)

    def output_screen(self, min_holdback_chars: int) -> StreamScreen | None:
        """A screen for one streamed response, holding back ``min_holdback_chars`` or the longest match
        a rule can make, whichever is more; None when this policy does not screen output."""
        if not self.output_classifiers:
            return None
        required = max(c.max_match_chars or 0 for c in self.output_classifiers)
        return StreamScreen(self.output_classifiers, max(min_holdback_chars, required, 1))

    def screen_output(self, text: str) -> Verdict | None:
        """The first blocking verdict on a whole (non-streamed) output, or None."""
        for classifier in self.output_classifiers:
            verdict = classifier.classify_now(text)
            if verdict.blocked:
                return verdict
        return None


def _screen_in_pieces(classifier: Classifier, text: str) -> Verdict:
    """``classifier.classify_now(text)``, decided piece by piece (see ``PIECE_CHARS``)."""
    screen = StreamScreen([classifier], max(1, classifier.max_match_chars or 0))
    for start in range(0, len(text), PIECE_CHARS):
        _, verdict = screen.feed(text[start : start + PIECE_CHARS])
        if verdict is not None:
            return verdict
    _, verdict = screen.finish()
    return verdict or Verdict.allow(classifier.name)


def _spec(name: str, config: SafetyConfig) -> PolicySpec:
    spec = BUILTIN_POLICIES.get(name) or config.policies.get(name)
    if spec is None:
        raise UnknownPolicyError(f"unknown safety policy {name!r}; known: {', '.join(policy_names(config))}")
    return spec


class _Classifiers:
    """Builds each classifier once, so policies naming the same one share it (and its gRPC client)."""

    def __init__(self, config: SafetyConfig, triton: TritonClassifier | None) -> None:
        self._config = config
        self._triton = triton
        self._built: dict[str, Classifier] = {}

    def get(self, ref: ClassifierRef, policy: str) -> Classifier:
        if ref == "triton":
            if self._triton is None:
                raise ValueError(
                    f"safety policy {policy!r} uses the Triton classifier: give triton_url or triton"
                )
            return self._triton
        if ref not in self._built:
            groups = {"rules": (True, True, True), "content": (True, True, False)}
            groups |= {"blocklist": (True, False, False), "regexes": (False, True, False)}
            groups |= {"pii": (False, False, True)}
            blocklist, regexes, pii = groups[ref]
            self._built[ref] = build_rules(self._config, blocklist, regexes, pii, name=ref)
        return self._built[ref]

    def many(self, refs: Sequence[ClassifierRef], policy: str) -> tuple[Classifier, ...]:
        """The classifiers ``refs`` name, less rule groups with no rules (one would only hold streamed
        text back for nothing)."""
        built = (self.get(ref, policy) for ref in refs)
        return tuple(c for c in built if not (isinstance(c, RulesClassifier) and not c.rules))


def _triton(
    triton_url: str | None, classifier_model: str, triton: TritonClassifier | None
) -> TritonClassifier | None:
    if triton is not None or triton_url is None:
        return triton
    return TritonClassifier(triton_url, model_name=classifier_model)


def build_policy(
    name: str,
    config: SafetyConfig,
    *,
    triton_url: str | None = None,
    classifier_model: str = "sluice-guard",
    triton: TritonClassifier | None = None,
) -> SafetyPolicy:
    """The named policy's classifiers. ``UnknownPolicyError`` for a name neither built in nor
    configured; ``ValueError`` if it needs the Triton classifier and neither ``triton_url`` nor
    ``triton`` is given."""
    spec = _spec(name, config)
    classifiers = _Classifiers(config, _triton(triton_url, classifier_model, triton))
    return SafetyPolicy(name, classifiers.many(spec.input, name), classifiers.many(spec.output, name))


def build_policies(
    config: SafetyConfig,
    *,
    triton_url: str | None = None,
    classifier_model: str = "sluice-guard",
    triton: TritonClassifier | None = None,
) -> dict[str, SafetyPolicy]:
    """Every policy, sharing classifiers (one Triton client for all). Built at start: a policy that needs
    the Triton classifier without a url fails here, not on a request."""
    classifiers = _Classifiers(config, _triton(triton_url, classifier_model, triton))
    policies = {}
    for name in policy_names(config):
        spec = _spec(name, config)
        policies[name] = SafetyPolicy(
            name, classifiers.many(spec.input, name), classifiers.many(spec.output, name)
        )
    return policies
