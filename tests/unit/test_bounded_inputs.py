"""Bounded expansion: what one data item may grow into while it is read, chunked and added.

Each hostile input is built here: a docx whose XML inflates far past its size, JSON nested
deep or flattened into much more text than it holds, a CSV whose header repeats on every
row, a run of letters without whitespace, a file over the size cap, a link out of the folder.
"""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
from pathlib import Path

import docx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kenning.pipeline.chunking import CHARS_PER_TOKEN, ChunkingConfig, chunk_text
from kenning.pipeline.errors import InputError
from kenning.pipeline.ingest import Source, add, path_sources
from kenning.pipeline.loaders import MAX_BYTES, InputLimits, detect_kind, extract_rows, extract_text
from kenning.pipeline.models import ItemStatus, Scope
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import TwinServices

SCOPE = Scope(tenant="t1", dataset="hostile")
PARAGRAPH = b"<w:p><w:r><w:t>all work and no play makes a dull document</w:t></w:r></w:p>"


def docx_with_body(body_bytes: int) -> bytes:
    """A valid docx whose document.xml holds `body_bytes` of repeated paragraphs."""
    buffer = io.BytesIO()
    docx.Document().save(buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source:
        members = {info.filename: source.read(info) for info in source.infolist()}
    head, tail = members["word/document.xml"].split(b"<w:body>", 1)
    members["word/document.xml"] = head + b"<w:body>" + PARAGRAPH * (body_bytes // len(PARAGRAPH)) + tail
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def nested_json(depth: int, key: str, leaves: int) -> bytes:
    return (f'{{"{key}": ' * depth + json.dumps([1] * leaves) + "}" * depth).encode()


def test_a_docx_whose_xml_inflates_a_hundredfold_is_refused_naming_the_cap() -> None:
    # Given a docx of a few tens of KiB holding 16 MiB of XML
    data = docx_with_body(16 * 2**20)
    assert len(data) < 200_000
    # When its text is extracted
    with pytest.raises(InputError) as raised:
        extract_text(detect_kind("report.docx", data), data, name="report.docx")
    # Then it is refused, naming the item, the cap and the setting that sets it
    assert "report.docx" in str(raised.value) and "KENNING_MAX_UNPACK_RATIO" in str(raised.value)


def test_an_archive_member_is_inflated_block_by_block_never_whole() -> None:
    # Given a docx whose members declare their true sizes, but inflate past the absolute cap
    data = docx_with_body(8 * 2**20)
    limits = InputLimits(max_unpacked_bytes=2 * 2**20, max_unpack_ratio=10_000)
    # When its text is extracted, its memory traced
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="KENNING_MAX_UNPACKED_BYTES"):
            extract_text("docx", data, limits=limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Then it stops at the cap without ever holding the 8 MiB member
    assert peak < 4 * 2**20


def test_json_that_flattens_into_much_more_text_than_it_holds_is_refused() -> None:
    # Given 40 KiB of nested JSON whose paths would flatten into about 45 MiB of text
    data = nested_json(depth=50, key="k" * 300, leaves=3_000)
    assert len(data) < 41 * 1024
    # When its text is extracted
    with pytest.raises(InputError, match="KENNING_MAX_UNPACK_RATIO") as raised:
        extract_text("json", data, name="nested.json")
    # Then the item is named in the error
    assert str(raised.value).startswith("nested.json: ")


def test_json_nested_past_the_depth_cap_is_refused_for_text_and_rows() -> None:
    data = nested_json(depth=150, key="k", leaves=1)
    with pytest.raises(InputError, match="KENNING_MAX_JSON_DEPTH"):
        extract_text("json", data)
    with pytest.raises(InputError, match="KENNING_MAX_JSON_DEPTH"):
        extract_rows("json", data)
    assert extract_text("json", data, limits=InputLimits(max_json_depth=200)).endswith(": 1")


def test_a_csv_whose_long_header_repeats_on_every_row_is_refused() -> None:
    # Given 60 KiB of CSV: twenty 1,000-character column names, and a thousand rows of ones
    header = ",".join(f"{number:04d}" + "c" * 996 for number in range(20))
    data = (header + "\n" + ("1," * 19 + "1\n") * 1_000).encode()
    # When its text is extracted, it would be 20 MiB: it is refused
    with pytest.raises(InputError, match="KENNING_MAX_UNPACK_RATIO"):
        extract_text("csv", data)


def test_a_long_run_without_whitespace_is_cut_so_no_chunk_exceeds_the_cap() -> None:
    # Given a text holding a 3 MB word
    config = ChunkingConfig()
    text = "A short opening sentence. " + "x" * 3_000_000 + " And a closing one."
    # When it is chunked
    pieces = chunk_text(text, config)
    # Then every chunk stays within the token cap, and its characters with it
    assert len(pieces) > 1000
    assert max(piece.token_count for piece in pieces) <= config.size
    assert max(len(piece.text) for piece in pieces) <= config.size * (CHARS_PER_TOKEN + 1)
    assert "".join(piece.text.replace(" ", "") for piece in pieces).count("x") >= 3_000_000


def test_ordinary_text_chunks_as_before() -> None:
    # Words of ordinary length count one token each, as they always did
    text = "Ada Lovelace wrote notes on the Analytical Engine. " * 200
    pieces = chunk_text(text, ChunkingConfig())
    assert all(piece.token_count <= 256 for piece in pieces)
    assert pieces[0].token_count == pieces[0].text.count(" ") + 1 + pieces[0].text.count(".")


def test_the_pipeline_records_a_hostile_item_as_failed_and_the_rest_proceeds() -> None:
    # Given a dataset holding a hostile docx, deep JSON and an ordinary text
    services = TwinServices()
    hostile = [
        Source(name="bomb.docx", uri="test:bomb.docx", data=docx_with_body(16 * 2**20)),
        Source(name="deep.json", uri="test:deep.json", data=nested_json(150, "k", 1)),
        Source(name="ada.txt", uri="test:ada.txt", data=b"Ada Lovelace wrote the first algorithm."),
    ]
    add(services.metadata, services.blobs, SCOPE, hostile)
    # When it is cognified
    run = LocalRunner(services, services.lock, concurrency=2).run(SCOPE)
    # Then each hostile item failed with its cap, and the text was done
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None and run.status.value == "completed_with_errors"
    items = {item.name: item for item in services.metadata.list_items(dataset.id)}
    assert items["bomb.docx"].status == ItemStatus.FAILED and "KENNING_MAX_UNPACK" in items["bomb.docx"].error
    assert (
        items["deep.json"].status == ItemStatus.FAILED
        and "KENNING_MAX_JSON_DEPTH" in items["deep.json"].error
    )
    assert items["ada.txt"].status == ItemStatus.DONE


def test_the_caps_set_in_the_settings_are_the_ones_the_pipeline_applies(tmp_path: Path) -> None:
    # Given a home whose JSON depth cap is 3, and a JSON document nested 5 deep
    from kenning.workers.memory import Kenning
    from kenning.workers.runtime.settings import load_settings

    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", max_json_depth=3)
    with Kenning(settings) as memory:
        memory.add([Source(name="deep.json", uri="test:deep.json", data=nested_json(5, "k", 1))])
        # When it is cognified
        memory.cognify()
        # Then the item failed at that cap, named with the item and the setting
        (item,) = memory.wiring.metadata.list_items(memory.dataset().id)
    assert item.status == ItemStatus.FAILED
    assert item.error.startswith("deep.json") and "KENNING_MAX_JSON_DEPTH" in item.error


def test_a_link_out_of_the_added_folder_is_skipped_with_its_reason(tmp_path: Path) -> None:
    # Given a folder holding a text, a link to a file outside it, and a link to a file inside it
    outside = tmp_path / "secret.txt"
    outside.write_text("outside the folder")
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("Ada Lovelace wrote the first program.")
    (folder / "out").symlink_to(outside)
    (folder / "etc").symlink_to("/etc")
    (folder / "same").symlink_to(folder / "a.txt")
    errors: dict[str, str] = {}
    # When the folder is added
    sources = list(path_sources([str(folder)], errors))
    # Then the links out of it are skipped with their reason; the one within it is read
    assert sorted(source.name for source in sources) == ["a.txt", "same"]
    assert "outside the directory" in errors[str(folder / "out")]
    assert "outside the directory" in errors[str(folder / "etc")]
    assert all(b"outside the folder" not in source.data for source in sources)


def test_a_file_over_the_size_cap_is_an_error_and_the_rest_is_added(tmp_path: Path) -> None:
    # Given a folder with a (sparse) file one byte over the cap, and a small text
    folder = tmp_path / "files"
    folder.mkdir()
    with (folder / "huge.bin").open("wb") as huge:
        huge.truncate(MAX_BYTES + 1)
    (folder / "small.txt").write_text("Grace Hopper built a compiler.")
    errors: dict[str, str] = {}
    # When the folder is added, with the default cap and with a small one
    sources = list(path_sources([str(folder)], errors))
    small_cap: dict[str, str] = {}
    capped = list(path_sources([str(folder / "small.txt")], small_cap, max_bytes=10))
    # Then the file over the cap is an error naming the cap and its setting, the rest is added
    assert [source.name for source in sources] == ["small.txt"]
    assert "KENNING_MAX_DOCUMENT_BYTES" in errors[str(folder / "huge.bin")]
    assert not capped and "over the limit of 10 bytes" in small_cap[str(folder / "small.txt")]


# Hostile archives and nested data, generated.

SMALL = InputLimits(max_unpacked_bytes=2 * 2**20, max_unpack_ratio=50, max_json_depth=32)


@st.composite
def hostile_zips(draw: st.DrawFn) -> bytes:
    members = draw(st.integers(min_value=1, max_value=6))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"<w:document/>")
        for number in range(members):
            size = draw(st.integers(min_value=0, max_value=96)) * 64 * 1024
            byte = draw(st.sampled_from([b"\x00", b"a", b" "]))
            archive.writestr(f"word/part{number}.xml", byte * size)
    return out.getvalue()


@st.composite
def hostile_json(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(min_value=1, max_value=80))
    key = "k" * draw(st.integers(min_value=1, max_value=400))
    leaves = draw(st.integers(min_value=1, max_value=30)) * 100
    return nested_json(depth, key, leaves)


HOSTILE_ITEMS = st.one_of(
    st.tuples(st.just("docx"), hostile_zips()), st.tuples(st.just("json"), hostile_json())
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind_and_data=st.one_of(
        st.tuples(st.just("docx"), hostile_zips()), st.tuples(st.just("json"), hostile_json())
    )
)
def test_hostile_inputs_stay_within_the_caps_or_fail_clearly(kind_and_data: tuple[str, bytes]) -> None:
    kind, data = kind_and_data
    cap = min(SMALL.max_unpacked_bytes, max(2**20, len(data) * SMALL.max_unpack_ratio))
    tracemalloc.start()
    try:
        text = extract_text(kind, data, limits=SMALL, name="item")
    except InputError as error:
        text, said = "", str(error)
        over_a_cap = said.startswith("item: ") and "KENNING_" in said
        assert over_a_cap or said.startswith(("corrupt or unreadable docx", "no text")), said
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert len(text) <= cap
    assert peak < 4 * cap + 8 * len(data) + 16 * 2**20
