"""The weight store's tests run against moto's S3 server on 127.0.0.1 (tests/s3_server.py)."""

from s3_server import moto_s3, s3_bucket

__all__ = ["moto_s3", "s3_bucket"]
