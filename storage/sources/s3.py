"""Objects from S3 or any S3-compatible store, through boto3."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions

from kenning.pipeline.errors import InputError, StoreError, TransientStoreError

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    etag: str


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix)."""
    if not uri.startswith("s3://") or len(uri) <= 5:
        raise InputError(f"not an S3 URI: {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix


class S3Source:
    """One bucket. The endpoint comes from `endpoint_url`, else boto3's own configuration
    (including `AWS_ENDPOINT_URL`), so any S3-compatible store works."""

    def __init__(self, bucket: str, endpoint_url: str | None = None, region: str | None = None) -> None:
        self.bucket = bucket
        self._client: Any = boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region)

    def list_objects(self, prefix: str) -> Iterator[S3Object]:
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        with translated(f"list s3://{self.bucket}/{prefix}"):
            for page in pages:
                for entry in page.get("Contents", []):
                    yield S3Object(key=entry["Key"], size=int(entry["Size"]), etag=entry["ETag"].strip('"'))

    def read(self, key: str, max_bytes: int) -> bytes:
        with translated(f"read s3://{self.bucket}/{key}"):
            response = self._client.get_object(Bucket=self.bucket, Key=key)
            if int(response.get("ContentLength", 0)) > max_bytes:
                response["Body"].close()
                raise InputError(f"s3://{self.bucket}/{key} is over the limit of {max_bytes} bytes")
            data = bytearray()
            for piece in response["Body"].iter_chunks(READ_CHUNK):
                data += piece
            return bytes(data)


@contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn boto errors into store errors naming what was being done."""
    try:
        yield
    except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionError) as error:
        raise TransientStoreError(f"{action}: {error}") from error
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        raise StoreError(f"{action}: {error}") from error
