"""Run as a child process by the resume test: fetch an artifact and SIGKILL this very process just before
its (N+1)-th ranged GET, so the download dies as a node's would (threads, files and locks gone at once).

    python killed_fetch.py ENDPOINT_URL S3_URI CACHE_DIR PART_SIZE_BYTES NUM_GETS_BEFORE_KILL
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from sluice.weight_store import WeightStore, make_s3_client


class _KillingClient:
    def __init__(self, client: Any, num_allowed: int) -> None:
        self._client = client
        self._num_left = num_allowed
        self._lock = threading.Lock()

    def get_object(self, **params: Any) -> Any:
        if "Range" in params:
            with self._lock:
                if self._num_left <= 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                self._num_left -= 1
        return self._client.get_object(**params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def main() -> None:
    endpoint_url, uri, cache_dir, part_size_bytes, num_allowed = sys.argv[1:]
    client = _KillingClient(make_s3_client(endpoint_url=endpoint_url), int(num_allowed))
    store = WeightStore(client, Path(cache_dir), part_size_bytes=int(part_size_bytes), max_concurrency=2)
    store.fetch(uri)
    sys.exit("the fetch finished: it should have been killed first")


if __name__ == "__main__":
    main()
