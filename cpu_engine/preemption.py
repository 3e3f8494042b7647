"""Which running sequences give way, and in what order: pure choices over the running list (the scheduler
frees their blocks and queues them again).

For memory (a running sequence cannot write its next tokens): the lowest-priority, most recently admitted
running sequence, so batch work always goes before interactive work. For priority (a waiting sequence of a
higher class finds the running cap or the KV pool full): running sequences of a strictly LOWER class,
lowest class then most recently admitted first, and not one still in its grace after an earlier such
preemption (``PRIORITY_GRACE_TOKENS`` new tokens, so a stream of high-priority arrivals cannot keep one
sequence recomputing forever). Equal classes never preempt each other.
"""

from __future__ import annotations

from collections.abc import Iterable

from cpu_engine.sequence import Sequence

# New tokens a sequence preempted to admit a higher class makes before it can be chosen for that again.
PRIORITY_GRACE_TOKENS = 8


def memory_victim(running: Iterable[Sequence]) -> Sequence:
    """The running sequence to preempt when one cannot write its next tokens."""
    return max(running, key=lambda s: (s.priority, s.admitted_order))


def priority_victims(running: Iterable[Sequence], waiting: Sequence) -> list[Sequence]:
    """The running sequences that may give way to ``waiting``, in the order they are taken."""
    eligible = (
        s for s in running if s.priority > waiting.priority and s.num_tokens >= s.protected_until_num_tokens
    )
    return sorted(eligible, key=lambda s: (s.priority, s.admitted_order), reverse=True)


def protect_after_priority_preemption(victim: Sequence) -> None:
    """A victim of a priority preemption is safe from another until it has made its grace tokens."""
    victim.protected_until_num_tokens = victim.num_tokens + PRIORITY_GRACE_TOKENS
