"""Usage metering through failures: every record goes to a durable local outbox, then to the ledger
(``UsageMeter``), so a ledger outage or a restart loses nothing and the idempotent upsert doubles nothing."""
