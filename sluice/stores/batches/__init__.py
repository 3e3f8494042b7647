"""Batch jobs (OpenAI's Batch API): their durable state (``base.BatchStore``); the runner is the gateway's."""
