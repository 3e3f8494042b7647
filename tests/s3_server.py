"""An S3 server on 127.0.0.1 for tests: moto's S3 implementation (``moto.server.ThreadedMotoServer``), in
this process on a free port, with state in memory. It is moto, not AWS: the weight store's client talks
HTTP to it exactly as to AWS S3 or MinIO, through ``SLUICE_S3_ENDPOINT_URL``.

Use the session fixture from a test folder's conftest.py::

    from s3_server import moto_s3, s3_bucket  # noqa: F401  (pytest finds fixtures by name)

    def test_x(moto_s3: MotoS3, s3_bucket: str) -> None:
        client = moto_s3.client()
        subprocess.run([...], env={**os.environ, **moto_s3.env()})  # a child process reaches it too

or the context manager ``running_moto_s3()`` outside pytest.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pytest
from ports import free_port

# moto accepts any credentials; these keep boto3 from looking for real ones (and never reach AWS).
_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "moto-testing",
    "AWS_SECRET_ACCESS_KEY": "moto-testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class MotoS3:
    """A running moto S3 server: its endpoint URL, and how to reach it from this or a child process."""

    endpoint_url: str

    def env(self) -> dict[str, str]:
        """Environment for a process that should use this server: endpoint and moto's fake credentials."""
        return {**_FAKE_CREDENTIALS, "SLUICE_S3_ENDPOINT_URL": self.endpoint_url}

    def client(self) -> Any:
        """A new boto3 S3 client on this server (path-style addressing, fake credentials). Clients come
        from one boto3 session, which parses S3's service model once (a new session costs ~0.2 s)."""
        from botocore.config import Config

        with _SESSION_LOCK:
            return _session().client(
                "s3",
                endpoint_url=self.endpoint_url,
                config=Config(s3={"addressing_style": "path"}, max_pool_connections=32),
            )

    def create_bucket(self, name: str | None = None) -> str:
        """A new empty bucket (a unique name unless given); returns its name."""
        bucket = name or f"sluice-test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket


_SESSION_LOCK = threading.Lock()  # a boto3 session is not safe to make clients from in two threads


@lru_cache(maxsize=1)
def _session() -> Any:
    import boto3

    return boto3.session.Session(
        aws_access_key_id=_FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=_FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=_FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
    )


@contextmanager
def running_moto_s3() -> Iterator[MotoS3]:
    """Start moto's S3 server on a free loopback port; stop it on exit."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield MotoS3(endpoint_url=f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One moto S3 server for the session; moto's fake credentials are in os.environ meanwhile, so code
    under test that builds its client from boto3's default chain finds them."""
    with pytest.MonkeyPatch.context() as mp, running_moto_s3() as server:
        for name, value in _FAKE_CREDENTIALS.items():
            mp.setenv(name, value)
        # No ~/.aws profile of the machine may leak in (a developer's real credentials, another region).
        mp.setenv("AWS_CONFIG_FILE", "/dev/null")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        mp.delenv("AWS_PROFILE", raising=False)
        yield server


@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> str:
    """A fresh, empty bucket on the session's moto server for one test."""
    return moto_s3.create_bucket()
