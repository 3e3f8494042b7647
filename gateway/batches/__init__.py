"""OpenAI's Batch API on Sluice's own fleet: the API (``controller``), the input file's lines (``lines``),
their results (``results``), one line's run through the interactive path at the batch class
(``line_call``), and the runner that works batches through to their output files (``runner``)."""
