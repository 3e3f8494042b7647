"""bench.e2e_bench's reduction of one run's request timelines to its figures."""

from __future__ import annotations

import pytest

from bench.e2e_bench import Timeline, summary_of


def test_a_runs_summary_counts_text_chunks_and_keeps_the_first_wave_first() -> None:
    late = Timeline(sent_s=1.0, chunk_times_s=[1.5, 1.52, 1.56], completion_tokens=6)  # 2 tokens a chunk
    early = Timeline(sent_s=0.0, chunk_times_s=[0.1, 0.14], completion_tokens=3)
    silent = Timeline(sent_s=0.5)  # no text arrived
    summary = summary_of("sluice", 2, elapsed_s=2.0, timelines=[late, early, silent])
    assert summary.num_chunks == 5 and summary.output_tokens == 9
    assert summary.ttft_ms == pytest.approx([100.0, 500.0])  # in the order sent; the silent one has none
    assert summary.itl_ms == pytest.approx([40.0, 20.0, 40.0])
    assert summary.tpot_ms == pytest.approx([20.0, 12.0])  # (last - first) / (tokens - 1)
    assert summary.tokens_per_s == pytest.approx(4.5)
    # The first wave is the first 2 sent (early, then the silent one): only `late` comes after it.
    assert summary.later_itl_ms == pytest.approx([20.0, 40.0])
    # Its TTFT too: the silent request of the first wave does not shift the slice onto `late`'s neighbour.
    assert summary.later_ttft_ms == pytest.approx([500.0])
