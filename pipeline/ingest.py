"""`add`: data into a named dataset, deduplicated by content hash."""

from __future__ import annotations

import mimetypes
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel

from kenning.pipeline.errors import InputError
from kenning.pipeline.forget import REPLACEABLE_SOURCES, previous_versions
from kenning.pipeline.loaders import MAX_BYTES
from kenning.pipeline.models import DataItem, ItemStatus, Scope
from kenning.pipeline.ports import BlobStore, MetadataStore, ObjectSource


class Source(BaseModel):
    """One thing to add: a name, where it came from, and its bytes."""

    name: str
    uri: str
    data: bytes
    mime: str = ""
    version: str = ""
    node_sets: list[str] = []


class AddResult(BaseModel):
    added: list[DataItem] = []
    unchanged: list[DataItem] = []
    superseded: list[DataItem] = []
    skipped: list[str] = []
    errors: dict[str, str] = {}


def add(metadata: MetadataStore, blobs: BlobStore, scope: Scope, sources: Sequence[Source]) -> AddResult:
    """Store each source's bytes and a data item for it; the same bytes twice is a no-op.

    New content under a known file path, object key or external id supersedes the item it
    replaces: the next cognify forgets what only the old version supported.
    """
    dataset = metadata.ensure_dataset(scope)
    result = AddResult()
    known = _items_by_source(metadata, dataset.id) if any(_replaceable(s.uri) for s in sources) else {}
    for source in sources:
        item = DataItem.of(dataset, source.name, source.uri, source.data, source.mime, source.version)
        item.node_sets = list(source.node_sets)
        blobs.put(item.content_hash, source.data)
        if not metadata.add_item(item):
            result.unchanged.append(item)
            continue
        result.added.append(item)
        for old in previous_versions(item, known):
            replaced = f"replaced by a new version, item {item.id}"
            metadata.set_item_status(old.id, ItemStatus.SUPERSEDED, replaced)
            result.superseded.append(old)
    return result


def _replaceable(uri: str) -> bool:
    return uri.startswith(REPLACEABLE_SOURCES)


def _items_by_source(metadata: MetadataStore, dataset_id: str) -> dict[str, list[DataItem]]:
    found: dict[str, list[DataItem]] = {}
    for item in metadata.list_items(dataset_id):
        found.setdefault(item.source, []).append(item)
    return found


def text_source(text: str, name: str = "text", external_id: str = "") -> Source:
    """A text; with `external_id`, a later text of the same id replaces this one."""
    data = text.encode("utf-8")
    uri = f"id:{external_id}" if external_id else f"text:{name}"
    return Source(name=name, uri=uri, data=data, mime="text/plain")


def path_sources(
    paths: Sequence[str], errors: dict[str, str], max_bytes: int = MAX_BYTES
) -> Iterator[Source]:
    """Sources for files, directories (recursively, hidden files skipped) and `-` for stdin.

    A path that cannot be read is reported in `errors` and the others proceed; so is each one
    that is neither a regular file nor a directory (a device or a pipe might never end), with
    what it is, each file over `max_bytes` (no more than one byte past it is read), and each
    symbolic link in a directory that points out of it.
    """
    for raw in paths:
        if raw == "-":
            try:
                data = read_capped(sys.stdin.buffer, "stdin", max_bytes)
                yield Source(name="stdin", uri="stdin:", data=data)
            except InputError as error:
                errors[raw] = str(error)
            continue
        path = Path(raw)
        if not path.exists():
            errors[raw] = "no such file or directory"
            continue
        if not (path.is_file() or path.is_dir()):
            errors[raw] = skipped_because(path)
            continue
        for file in _files(path, errors):
            try:
                yield file_source(file, max_bytes)
            except InputError as error:
                errors[str(file)] = str(error)


def file_source(path: Path, max_bytes: int = MAX_BYTES) -> Source:
    try:
        with path.open("rb") as stream:
            data = read_capped(stream, str(path), max_bytes)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    mime = mimetypes.guess_type(path.name)[0] or ""
    return Source(name=path.name, uri=path.resolve().as_uri(), data=data, mime=mime)


def read_capped(stream: BinaryIO, name: str, max_bytes: int) -> bytes:
    """At most `max_bytes` of a stream: one byte more tells that it is longer, and then it is refused."""
    data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(
            f"{name}: over the limit of {max_bytes} bytes (set by KENNING_MAX_DOCUMENT_BYTES); not added"
        )
    return data


def _files(path: Path, errors: dict[str, str]) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    root = path.resolve()
    for file in sorted(path.rglob("*")):
        if any(part.startswith(".") for part in file.relative_to(path).parts):
            continue
        if file.is_symlink() and not file.resolve().is_relative_to(root):
            errors[str(file)] = "skipped: a symbolic link to a place outside the directory added"
        elif file.is_file():
            yield file
        elif not file.is_dir():
            errors[str(file)] = skipped_because(file)


def skipped_because(path: Path) -> str:
    """Why a path that is neither a regular file nor a directory is not read."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return "skipped: a broken symbolic link"
    kinds = (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    )
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return f"skipped: {kind}, not a regular file or a directory"


def bucket_sources(
    bucket: ObjectSource, base_uri: str, prefix: str, known: dict[str, str], result: AddResult, max_bytes: int
) -> Iterator[Source]:
    """Sources for every object under `prefix` whose version is not already stored.

    `known` maps source URIs to the version stored for them; unchanged objects are
    never downloaded and are listed in `result.skipped`. An object that cannot be read
    is recorded in `result.errors` and the others proceed.
    """
    for stored in bucket.list_objects(prefix):
        uri = f"{base_uri}/{stored.key}"
        if stored.key.endswith("/"):
            continue
        if stored.etag and known.get(uri) == stored.etag:
            result.skipped.append(uri)
            continue
        try:
            data = bucket.read(stored.key, max_bytes)
        except InputError as error:
            result.errors[uri] = str(error)
            continue
        name = stored.key.rsplit("/", 1)[-1]
        yield Source(
            name=name, uri=uri, data=data, mime=mimetypes.guess_type(name)[0] or "", version=stored.etag
        )


def known_versions(metadata: MetadataStore, scope: Scope) -> dict[str, str]:
    dataset = metadata.get_dataset(scope)
    if dataset is None:
        return {}
    return {item.source: item.version for item in metadata.list_items(dataset.id) if item.version}
