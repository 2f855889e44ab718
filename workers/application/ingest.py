"""Adding data for a caller: sources, local paths and buckets (read only where the allow-list lets it)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.ingest import AddResult, Source, add, bucket_sources, known_versions, path_sources
from kenning.pipeline.ports import ObjectSource, StoredObject
from kenning.workers.application import gate
from kenning.workers.application.context import Context
from kenning.workers.runtime.extras import needs_extra


def add_sources(
    context: Context, sources: Sequence[Source], dataset: str | None = None, node_sets: Sequence[str] = ()
) -> AddResult:
    """Add the sources; `node_sets` name the subsets every one of them joins, besides their own."""
    scope = context.scope(dataset)
    gate.require_write(context.caller, scope)
    if node_sets:
        sources = [_with_node_sets(source, node_sets) for source in sources]
    return add(context.wiring.metadata, context.wiring.blobs, scope, sources)


def add_paths(
    context: Context, paths: Sequence[str], dataset: str | None = None, node_sets: Sequence[str] = ()
) -> AddResult:
    """Add files, directories, `-` (stdin) and `s3://bucket/prefix` URIs (see `Kenning.add_paths`)."""
    gate.require_write(context.caller, context.scope(dataset))
    errors: dict[str, str] = {}
    local = [path for path in paths if not path.startswith("s3://")]
    found = list(path_sources(local, errors, context.settings.max_document_bytes))
    # Nothing read makes no dataset: a typo in a path must not leave an empty dataset behind.
    result = add_sources(context, found, dataset, node_sets) if found else AddResult()
    result.errors.update(errors)
    for uri in (path for path in paths if path.startswith("s3://")):
        add_bucket(context, uri, dataset, result, node_sets)
    return result


def add_bucket(
    context: Context, uri: str, dataset: str | None, result: AddResult, node_sets: Sequence[str] = ()
) -> None:
    """Add a bucket's objects under a prefix into `result`: one answer for refused and missing."""
    with needs_extra("reading s3:// sources"):
        from kenning.storage.sources.s3 import S3Source, parse_s3_uri

    settings = context.settings
    bucket, prefix = parse_s3_uri(uri)
    if not gate.may_read_bucket(context.caller, settings.s3_allow, bucket, prefix):
        result.errors[uri] = gate.UNREADABLE_BUCKET
        return
    source = Listed(S3Source(bucket, settings.s3_endpoint_url or None))
    known = known_versions(context.wiring.metadata, context.scope(dataset))
    found = AddResult()
    sources = bucket_sources(source, f"s3://{bucket}", prefix, known, found, settings.max_document_bytes)
    try:
        for batch in batched(sources, 64):
            added = add_sources(context, batch, dataset, node_sets)
            result.added += added.added
            result.unchanged += added.unchanged
    except Unlisted:  # missing, or not ours: the same answer as a bucket refused
        result.errors[uri] = gate.UNREADABLE_BUCKET
    result.skipped += found.skipped
    result.errors.update(found.errors)


class Unlisted(Exception):
    """A bucket could not be listed (it is missing, or the credentials may not list it)."""


class Listed:
    """A bucket whose listing failures, other than transient ones, are `Unlisted`: told apart from
    a store's failure to take what was read, and never shown (they say whether the bucket exists)."""

    def __init__(self, source: ObjectSource) -> None:
        self._source = source

    def list_objects(self, prefix: str) -> Iterator[StoredObject]:
        try:
            yield from self._source.list_objects(prefix)
        except TransientStoreError:
            raise
        except StoreError as error:
            raise Unlisted(str(error)) from error

    def read(self, key: str, max_bytes: int) -> bytes:
        return self._source.read(key, max_bytes)


def batched(sources: Iterable[Source], size: int) -> Iterator[list[Source]]:
    """Bounded lists, so a large bucket is never held in memory whole."""
    iterator = iter(sources)
    while batch := list(islice(iterator, size)):
        yield batch


def _with_node_sets(source: Source, node_sets: Sequence[str]) -> Source:
    merged = list(dict.fromkeys([*source.node_sets, *node_sets]))
    return source.model_copy(update={"node_sets": merged})
