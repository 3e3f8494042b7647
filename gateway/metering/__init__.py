"""Usage metering through failures: every request is opened in a durable local outbox at dispatch and
checkpointed while it streams, and its record goes there before the ledger (``UsageMeter``), so a ledger
outage, a restart or a killed gateway loses nothing, and a ledger that keeps a row's first write doubles
nothing."""
