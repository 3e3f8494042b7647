"""Where file bytes live: one interface (``ObjectStore``), two backends passing one contract suite
(tests/core/test_object_store.py): a directory (the embedded default, ``<state_dir>/files``) and an S3
bucket under a prefix (``SLUICE_FILES_URL=s3://bucket/prefix``).

Keys are ``/``-separated relative paths of safe characters (``check_key``); the catalog
(``sluice.stores.files.catalog``) lays tenants' files out under them, each tenant under its own prefix.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from typing import TypeVar

from sluice.names import is_object_key
from sluice.outages import OutageLog

T = TypeVar("T")


class ObjectNotFound(LookupError):
    pass


class ObjectStoreUnavailable(ConnectionError):
    """The store cannot answer now (S3 unreachable, disk error): retry later."""


async def reported(outage: OutageLog, call: Awaitable[T]) -> T:
    """``call``'s result, the store's outage reported on ``outage`` once each way (a WARNING when
    ``ObjectStoreUnavailable`` starts one, an INFO when an answer ends it): the store is the one owner of
    that report (``sluice.outages``), so the file endpoints and the sweeper that meet it log at DEBUG."""
    try:
        result = await call
    except ObjectStoreUnavailable as exc:
        outage.down(exc, "file requests get 503 and expired files wait for a later sweep")
        raise
    except ObjectNotFound:  # an answer: the store is up
        outage.up()
        raise
    outage.up()
    return result


def check_key(key: str) -> None:
    if not is_object_key(key):
        raise ValueError(f"not an object key: {key!r}")


class ObjectStore(ABC):
    """Every method raises ``ValueError`` for a key (or prefix) ``check_key`` refuses, before any I/O, and
    ``ObjectStoreUnavailable`` when the store cannot answer; never a driver's own error type."""

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def put(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` whole (a reader never sees part of it), replacing what was there."""

    @abstractmethod
    async def get(self, key: str) -> bytes:
        """``ObjectNotFound`` if there is nothing under ``key``."""

    @abstractmethod
    async def copy(self, src_key: str, dst_key: str) -> None:
        """Write what is under ``src_key`` under ``dst_key`` too, whole, as ``put`` writes (``src_key``
        is left as it is); ``ObjectNotFound(src_key)`` if there is nothing under it. A keeper of its own
        copy (a batch, of its input file) no longer depends on the original staying."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Does nothing if there is nothing under ``key``."""

    @abstractmethod
    async def list(self, prefix: str) -> list[str]:
        """The keys starting with ``prefix``, sorted: usually a folder (``files/acme/``); any key text,
        with or without a trailing ``/``, or empty for every key. S3's pages are all read."""
