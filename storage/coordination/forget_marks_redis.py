"""The forget mark of a distributed deployment (`kenning.storage.coordination.forget_marks`): one
Redis key, a count every forget adds one to."""

from __future__ import annotations

import redis

from kenning.pipeline.errors import TransientStoreError


class RedisForgetMark:
    """The mark in one Redis key, a count every forget adds one to."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self._client = client
        self._key = key

    def current(self) -> str:
        try:
            value = self._client.get(self._key)
        except redis.RedisError as error:
            raise TransientStoreError(f"Redis did not give the forget mark: {error}") from error
        return value.decode() if isinstance(value, bytes) else str(value or "")

    def advance(self) -> None:
        try:
            self._client.incr(self._key)
        except redis.RedisError as error:
            raise TransientStoreError(f"Redis did not take the forget mark: {error}") from error
