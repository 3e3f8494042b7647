"""One log for every Sluice process (the gateway, the control plane): a line per event a person reads while
the service runs, in one format, with time and logger.

Libraries that write a line per connection or per attempt are quieted here, and what they would have
written is counted instead (``QuietedLines``, exported by each service as
``sluice_quieted_log_lines_total{logger}``): psycopg_pool writes two WARNINGs for every failed reconnect
and every connection it discards during a database outage (hundreds per outage), where Sluice's stores say
once when an outage starts and once when it ends; uvicorn writes a bare "Exceeded concurrency limit." per
connection refused past ``limit_concurrency`` (the gateway answers those with its own 503 and counts them);
psycopg writes two WARNINGs for each query an outage interrupts (it cannot reach the server to cancel it).
Their errors still show.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# With a service name (a constant: "gateway", "control-plane"), tagged: `make run` shows both services'
# lines in one terminal, and both open the same stores under the same logger names.
SERVICE_LOG_FORMAT = "%(asctime)s %(levelname)s [{service}] %(name)s: %(message)s"
# Libraries that log each call at INFO: httpx logs every replica metrics read and every classifier call.
_CHATTY_LOGGERS = ("httpx", "httpcore")
_POOL_LOGGER = "psycopg.pool"
_DRIVER_LOGGER = "psycopg"
_UVICORN_LOGGER = "uvicorn.error"

_quieted: Counter[str] = Counter()
_quieted_lock = threading.Lock()


class _Quiet(logging.Filter):
    """Drops (and counts) a logger's records below ERROR that ``matches`` selects."""

    def __init__(self, name: str, message_prefix: str = "") -> None:
        super().__init__()
        self._name = name
        self._prefix = message_prefix

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or not record.getMessage().startswith(self._prefix):
            return True
        with _quieted_lock:
            _quieted[self._name] += 1
        return False


_FILTERS = (
    (_POOL_LOGGER, _Quiet(_POOL_LOGGER)),
    # a query interrupted by an outage's start (its caller refused at once): psycopg tries to cancel it
    # on the server it cannot reach, and says so twice per connection
    (_DRIVER_LOGGER, _Quiet(_DRIVER_LOGGER, "query cancellation")),
    (_UVICORN_LOGGER, _Quiet(_UVICORN_LOGGER, "Exceeded concurrency limit")),
)


def configure_logging(level: int = logging.INFO, service: str | None = None) -> None:
    """The process's log: ``level`` for Sluice, start-up, state changes and errors; not each poll, each
    connection or each retry. ``service``: the tag of every line (``SERVICE_LOG_FORMAT``)."""
    fmt = LOG_FORMAT if service is None else SERVICE_LOG_FORMAT.format(service=service)
    logging.basicConfig(level=level, format=fmt)
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    quiet_noisy_libraries()


def quiet_noisy_libraries() -> None:
    """Install the filters (idempotent; also for processes that configure their own handlers)."""
    for name, quiet in _FILTERS:
        logger = logging.getLogger(name)
        if quiet not in logger.filters:
            logger.addFilter(quiet)


def quieted_counts() -> dict[str, int]:
    with _quieted_lock:
        return dict(_quieted)


class QuietedLines(Collector):
    """``sluice_quieted_log_lines_total{logger}``: the lines the filters above kept out of the log."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "sluice_quieted_log_lines",
            "Log lines of noisy libraries (a connection pool's retries, a server's per-connection refusals) "
            "kept out of the log and counted here",
            labels=["logger"],
        )
        for name, _ in _FILTERS:
            family.add_metric([name], float(quieted_counts().get(name, 0)))
        yield family
