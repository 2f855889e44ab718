"""Loaders: raw bytes of a data item -> its kind, its plain text, and its rows when it is tabular."""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TypeGuard

from pydantic import BaseModel, Field
from selectolax.lexbor import LexborHTMLParser

from kenning.pipeline.errors import InputError

MAX_BYTES = 64 * 1024 * 1024
# Every item may expand this far whatever its own size: a short file is never refused by the ratio.
EXPANSION_FLOOR = 1024 * 1024
MAX_ARCHIVE_MEMBERS = 10_000
ZIP_MEMBER_SIGNATURE = b"PK\x01\x02"
UNPACK_BLOCK = 256 * 1024
KINDS = ("text", "markdown", "rst", "html", "pdf", "docx", "csv", "json")

EXTENSION_KINDS = {
    ".txt": "text", ".text": "text", ".log": "text",
    ".md": "markdown", ".markdown": "markdown", ".mdown": "markdown",
    ".rst": "rst", ".rest": "rst",
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".pdf": "pdf", ".docx": "docx",
    ".csv": "csv", ".tsv": "csv",
    ".json": "json",
}  # fmt: skip
# Source and config files hold lines (`# comment`) that sniffing would take for markup.
PLAIN_EXTENSIONS = frozenset(
    ".py .js .ts .java .c .h .cpp .go .rs .rb .sh .sql .yaml .yml .toml .ini .cfg .conf .xml .tex".split()
)
BINARY_MAGIC = {
    b"\x89PNG": "PNG image",
    b"\xff\xd8\xff": "JPEG image",
    b"GIF8": "GIF image",
    b"\x1f\x8b": "gzip archive",
    b"7z\xbc\xaf\x27\x1c": "7z archive",
    b"Rar!": "RAR archive",
    b"\xfd7zXZ\x00": "xz archive",
    b"\x28\xb5\x2f\xfd": "zstd archive",
    b"\x7fELF": "ELF executable",
    b"\xd0\xcf\x11\xe0": "legacy Office document",
    b"SQLite format 3\x00": "SQLite database",
    b"OggS": "Ogg media",
    b"fLaC": "FLAC audio",
    b"ID3": "MP3 audio",
}
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
# Tab, newline, carriage return, form feed and escape occur in real text; the other C0 bytes do not.
CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
MAX_CONTROL_SHARE = 0.05
MAX_LEGACY_CONTROL_SHARE = 0.01
MAX_LEGACY_HIGH_SHARE = 0.3
SNIFF_CHARS = 65536

DROPPED_TAGS = ["script", "style", "nav", "noscript", "template", "iframe", "svg"]
BLOCK_TAGS = (
    "p,div,section,article,main,header,footer,aside,h1,h2,h3,h4,h5,h6,li,dt,dd,ul,ol,dl,"
    "blockquote,table,tr,form,fieldset,figure,figcaption,address,hr,title,caption"
)
CELL_TAGS = "td,th"
# Source newlines in HTML are mere whitespace; private-use characters mark the line and cell
# boundaries the tree implies while it is flattened, and become "\n" and " | " afterwards.
LINE_MARK = "\ue001"
CELL_MARK = "\ue000"

RST_DIRECTIVE = re.compile(r"^\s*\.\.\s+[\w:-]+::")
RST_COMMENT = re.compile(r"^\s*\.\.(\s|$)")
RST_OPTION = re.compile(r"^\s+:[\w -]+:(\s|$)")
RST_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+:.!_])\1{2,}\s*$")
RST_INLINE = (
    (re.compile(r":[\w:+-]+:`([^`]+)`"), r"\1"),
    (re.compile(r"`([^`<]+?)\s*<[^>`]+>`_{1,2}"), r"\1"),
    (re.compile(r"``(.+?)``"), r"\1"),
    (re.compile(r"\*\*(\S(?:.*?\S)?)\*\*"), r"\1"),
    (re.compile(r"\*(\S(?:.*?\S)?)\*"), r"\1"),
    (re.compile(r"`([^`]+)`_{0,2}"), r"\1"),
    (re.compile(r"::$"), ":"),
)
MARKDOWN_HINT = re.compile(r"^#{1,6}\s+\S|^```|^~~~|\[[^\]\n]+\]\([^)\s]+\)", re.MULTILINE)
RST_HINT = re.compile(r"^\.\.\s+[\w-]+::|^(\S[^\n]{2,})\n([=\-~^\"'`#*+])\2{2,}[ \t]*$", re.MULTILINE)
HTML_HINT = re.compile(r"^\s*(<!--.*?-->\s*)*<(!doctype\s+html|html)[\s>]", re.IGNORECASE | re.DOTALL)
CSV_DELIMITERS = (",", "\t", ";", "|")
MAX_HEADER_CELL = 64
SNIFF_ROWS = 20


class InputLimits(BaseModel):
    """How far one data item may expand while it is read (archive members, text, nesting)."""

    max_unpacked_bytes: int = Field(
        default=MAX_BYTES, ge=1, description="Most bytes one item expands into: archive members, its text"
    )
    max_unpack_ratio: int = Field(
        default=100, ge=1, description="Most times its own size an item expands into (1 MiB always may)"
    )
    max_json_depth: int = Field(default=100, ge=1, description="Deepest nesting of a JSON document")


@dataclass(frozen=True)
class Budget:
    """What one item may expand into, and the setting that sets that cap."""

    name: str
    cap: int
    setting: str
    depth: int

    @classmethod
    def of(cls, data: bytes, limits: InputLimits, name: str = "") -> Budget:
        by_ratio = max(EXPANSION_FLOOR, len(data) * limits.max_unpack_ratio)
        if by_ratio < limits.max_unpacked_bytes:
            setting = f"{limits.max_unpack_ratio} times its size, set by KENNING_MAX_UNPACK_RATIO"
            return cls(name, by_ratio, setting, limits.max_json_depth)
        return cls(
            name, limits.max_unpacked_bytes, "set by KENNING_MAX_UNPACKED_BYTES", limits.max_json_depth
        )

    def over(self, what: str) -> InputError:
        return InputError(f"{self.prefix()}{what} expands past {self.cap} bytes, the cap ({self.setting})")

    def too_deep(self) -> InputError:
        depth = f"{self.depth} levels, the cap (set by KENNING_MAX_JSON_DEPTH)"
        return InputError(f"{self.prefix()}JSON nested deeper than {depth}")

    def prefix(self) -> str:
        return f"{self.name}: " if self.name else ""


DEFAULT_LIMITS = InputLimits()


def bounded_join(lines: Iterable[str], budget: Budget, what: str) -> str:
    """The lines joined by newlines; InputError as soon as they grow past the budget's cap."""
    kept: list[str] = []
    size = 0
    for line in lines:
        size += len(line) + 1
        if size > budget.cap:
            raise budget.over(what)
        kept.append(line)
    return "\n".join(kept)


# Guards and decoding.


def check_size(data: bytes, max_bytes: int = MAX_BYTES) -> None:
    if len(data) > max_bytes:
        raise InputError(f"input is {len(data)} bytes, over the limit of {max_bytes} bytes")


def decode_text(data: bytes, max_bytes: int = MAX_BYTES) -> str:
    """Text of `data`: UTF-8 (BOM stripped), UTF-16/32 with a BOM, or legacy cp1252 text.

    Newlines come back as `\\n`. Binary content, and bytes that are neither UTF-8 nor
    plausible legacy text, raise InputError (naming the first byte that is not UTF-8).
    """
    check_size(data, max_bytes)
    return normalize_newlines(decode_bytes(data))


def decode_bytes(data: bytes) -> str:
    for bom, codec in BOMS:
        if data.startswith(bom):
            return decode_marked(data, codec, len(bom))
    reject_binary(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return decode_legacy(data, exc)


def decode_marked(data: bytes, codec: str, start: int) -> str:
    try:
        text = data[start:].decode(codec)
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid {codec} text: bad byte at offset {start + exc.start}") from exc
    reject_binary(text.encode("utf-8", "surrogatepass"))
    return text


def reject_binary(data: bytes) -> None:
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(f"binary content, not text: NUL byte at offset {nul}")
    share = control_share(data)
    if share > MAX_CONTROL_SHARE:
        raise InputError(f"binary content, not text: {share:.0%} control bytes")


def control_share(data: bytes) -> float:
    return (len(data) - len(data.translate(None, CONTROL_BYTES))) / max(len(data), 1)


def decode_legacy(data: bytes, error: UnicodeDecodeError) -> str:
    bad = f"not valid UTF-8: byte 0x{data[error.start]:02x} at offset {error.start}"
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        raise InputError(bad) from error
    high = (len(data) - len(data.translate(None, bytes(range(0x80, 0x100))))) / len(data)
    if high > MAX_LEGACY_HIGH_SHARE or control_share(data) > MAX_LEGACY_CONTROL_SHARE:
        raise InputError(bad) from error
    return text


def normalize_newlines(text: str) -> str:
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


# Kind detection.


def detect_kind(
    name: str, data: bytes, max_bytes: int = MAX_BYTES, limits: InputLimits = DEFAULT_LIMITS
) -> str:
    """One of KINDS for a data item, from its name's extension and its content.

    Binary formats are recognised by content whatever the name says; a name without a
    known extension (stdin is `-`) is sniffed. Empty, binary or unsupported content
    raises InputError.
    """
    check_size(data, max_bytes)
    if not data or data.isspace():
        raise InputError("empty file")
    budget = Budget.of(data, limits, name)
    binary = detect_binary(name, data, budget)
    if binary:
        return binary
    claimed = EXTENSION_KINDS.get(extension(name))
    if claimed in ("pdf", "docx"):
        raise InputError(f"{name} is named as {claimed} but its content is not {claimed}")
    text = decode_bytes(data)
    if not text.strip():
        raise InputError("empty file")
    if claimed == "json":
        parse_json(text, budget)
    return claimed or sniff_text(name, text)


def extension(name: str) -> str:
    return PurePosixPath(name.replace("\\", "/")).suffix.lower()


def detect_binary(name: str, data: bytes, budget: Budget) -> str | None:
    if data.startswith(b"%PDF-") or (extension(name) == ".pdf" and b"%PDF-" in data[:1024]):
        return "pdf"
    if data.startswith(b"PK\x03\x04"):
        return detect_zip(data, budget)
    for magic, label in BINARY_MAGIC.items():
        if data.startswith(magic):
            raise InputError(f"unsupported binary format: {label}")
    return None


def detect_zip(data: bytes, budget: Budget) -> str:
    count_members(data, budget)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise InputError(f"corrupt or truncated zip archive: {exc}") from exc
    check_declared(infos, budget)
    if "word/document.xml" not in {info.filename for info in infos}:
        raise InputError("unsupported binary format: zip archive that is not a .docx document")
    return "docx"


def count_members(data: bytes, budget: Budget) -> None:
    # Counted before the archive is opened: zipfile reads its whole directory into memory at once.
    if data.count(ZIP_MEMBER_SIGNATURE) > MAX_ARCHIVE_MEMBERS:
        raise InputError(f"{budget.prefix()}zip archive of more than {MAX_ARCHIVE_MEMBERS} members")


def check_declared(infos: list[zipfile.ZipInfo], budget: Budget) -> None:
    declared = sum(info.file_size for info in infos)
    if declared > budget.cap:
        raise budget.over(f"zip archive (its members declare {declared} bytes)")


def check_members(data: bytes, budget: Budget, kind: str = "zip archive") -> None:
    """Inflate every member of a zip archive block by block, counting what comes out: the first
    block past the budget's cap stops it, so no member is ever inflated whole beyond it."""
    count_members(data, budget)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            check_declared(infos, budget)
            total = 0
            for info in infos:
                with archive.open(info) as member:
                    while block := member.read(UNPACK_BLOCK):
                        total += len(block)
                        if total > budget.cap:
                            raise budget.over(f"zip archive member {info.filename}")
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, RuntimeError, NotImplementedError) as exc:
        raise InputError(f"corrupt or unreadable {kind}: {exc}") from exc


def sniff_text(name: str, text: str) -> str:
    if extension(name) in PLAIN_EXTENSIONS:
        return "text"
    return next((kind for kind, looks in SNIFFERS if looks(text)), "text")


def looks_html(text: str) -> bool:
    return HTML_HINT.match(text[:SNIFF_CHARS]) is not None


def looks_json(text: str) -> bool:
    if text.lstrip()[:1] not in ("{", "["):
        return False
    try:
        parse_json(text)
    except InputError:
        return False
    return True


def looks_markdown(text: str) -> bool:
    return MARKDOWN_HINT.search(text[:SNIFF_CHARS]) is not None


def looks_rst(text: str) -> bool:
    return any(is_rst_title(match) for match in RST_HINT.finditer(text[:SNIFF_CHARS]))


def is_rst_title(match: re.Match[str]) -> bool:
    title = match.group(1)
    if title is None:
        return True
    return len(match.group(0)[len(title) + 1 :].rstrip()) >= len(title.rstrip())


def looks_csv(text: str) -> bool:
    lines = [line for line in text[:SNIFF_CHARS].split("\n")[:SNIFF_ROWS] if line.strip()]
    if len(lines) < 3:
        return False
    delimiter = pick_delimiter(lines[0])
    try:
        records = list(csv.reader(lines, delimiter=delimiter))
    except csv.Error:
        return False
    widths = {len(record) for record in records}
    return len(widths) == 1 and widths.pop() > 1 and all(map(looks_header_cell, records[0]))


def looks_header_cell(cell: str) -> bool:
    cell = cell.strip()
    return 0 < len(cell) <= MAX_HEADER_CELL and not cell.endswith(".")


SNIFFERS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("html", looks_html),
    ("json", looks_json),
    ("markdown", looks_markdown),
    ("rst", looks_rst),
    ("csv", looks_csv),
)


# Text extraction.


def extract_text(
    kind: str, data: bytes, max_bytes: int = MAX_BYTES, limits: InputLimits = DEFAULT_LIMITS, name: str = ""
) -> str:
    """Plain text of a data item of the given kind; InputError when none can be had, or when the
    item expands past `limits` (its archive members, its nesting or its text)."""
    check_size(data, max_bytes)
    extractor = EXTRACTORS.get(kind)
    if extractor is None:
        raise InputError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    budget = Budget.of(data, limits, name)
    text = extractor(data, budget)
    if len(text) > budget.cap:
        raise budget.over("its text")
    if not text.strip():
        raise InputError("no text could be extracted")
    return text


def plain_text(data: bytes, budget: Budget | None = None) -> str:
    return normalize_newlines(decode_bytes(data))


def markdown_text(data: bytes, budget: Budget) -> str:
    # The parsers of rarer formats are imported on first use: together they take about a second.
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(plain_text(data))
    return html_to_text(html)


def rst_text(data: bytes, budget: Budget) -> str:
    lines = (clean_rst_line(line) for line in plain_text(data).split("\n") if not is_rst_markup(line))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def is_rst_markup(line: str) -> bool:
    return any(pattern.match(line) for pattern in (RST_DIRECTIVE, RST_COMMENT, RST_OPTION, RST_ADORNMENT))


def clean_rst_line(line: str) -> str:
    for pattern, replacement in RST_INLINE:
        line = pattern.sub(replacement, line)
    return line.rstrip()


def html_text(data: bytes, budget: Budget) -> str:
    return html_to_text(plain_text(data))


def html_to_text(html: str) -> str:
    tree = LexborHTMLParser(html)
    tree.strip_tags(DROPPED_TAGS)
    mark_boundaries(tree)
    root = tree.root
    text: str = root.text() if root is not None else ""
    lines = (clean_html_line(line) for line in text.split(LINE_MARK))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def mark_boundaries(tree: LexborHTMLParser) -> None:
    for node in tree.css("pre"):
        lines = node.text().split("\n")
        node.replace_with(LINE_MARK + LINE_MARK.join(lines) + LINE_MARK)
    for node in tree.css(BLOCK_TAGS):
        node.insert_before(LINE_MARK)
        node.insert_after(LINE_MARK)
    for node in tree.css("br"):
        node.insert_after(LINE_MARK)
    for node in tree.css(CELL_TAGS):
        node.insert_before(CELL_MARK)


def clean_html_line(line: str) -> str:
    cells = (" ".join(cell.split()) for cell in line.split(CELL_MARK))
    return " | ".join(cell for cell in cells if cell)


PDF_OUTPUT_LIMITS = (
    "zlib_maximum_output_length",
    "lzw_maximum_output_length",
    "run_length_maximum_output_length",
    "brotli_maximum_output_length",
    "jbig2_maximum_output_length",
    "array_based_stream_maximum_output_length",
)


def pdf_text(data: bytes, budget: Budget) -> str:
    from pypdf import PasswordType, PdfReader, apply_configuration
    from pypdf.errors import LimitReachedError

    # pypdf raises many exception types on damaged files; all of them mean the same to a caller.
    try:
        with apply_configuration(None, **dict.fromkeys(PDF_OUTPUT_LIMITS, budget.cap)):
            reader = PdfReader(io.BytesIO(data), strict=False)
            if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
                raise InputError("encrypted PDF: a password is needed to read it")
            pages = (page.extract_text() + "\n" for page in reader.pages)
            return bounded_join(pages, budget, "its PDF text").rstrip("\n")
    except InputError:
        raise
    except LimitReachedError as exc:
        raise budget.over(f"a PDF stream ({exc})") from exc
    except Exception as exc:
        raise InputError(f"corrupt or unreadable PDF: {exc}") from exc


def docx_text(data: bytes, budget: Budget) -> str:
    import docx

    check_members(data, budget, "docx")
    # python-docx surfaces zip, XML and package errors of several types on damaged files.
    try:
        document = docx.Document(io.BytesIO(data))
        return "\n\n".join(docx_block_text(block) for block in document.iter_inner_content())
    except Exception as exc:
        raise InputError(f"corrupt or unreadable docx: {exc}") from exc


def docx_block_text(block: object) -> str:
    rows = getattr(block, "rows", None)
    if rows is None:
        return str(getattr(block, "text", ""))
    return "\n".join(" | ".join(cell.text for cell in row.cells) for row in rows)


def csv_text(data: bytes, budget: Budget) -> str:
    lines = (format_row(row) for row in csv_records(plain_text(data)))
    return bounded_join((line for line in lines if line), budget, "its CSV text")


def json_text(data: bytes, budget: Budget) -> str:
    return bounded_join(flatten_json(parse_json(plain_text(data), budget)), budget, "its JSON text")


EXTRACTORS: dict[str, Callable[[bytes, Budget], str]] = {
    "text": plain_text,
    "markdown": markdown_text,
    "rst": rst_text,
    "html": html_text,
    "pdf": pdf_text,
    "docx": docx_text,
    "csv": csv_text,
    "json": json_text,
}


def format_row(row: Mapping[str, str]) -> str:
    """A row as one line, "col: value; col: value", leaving out empty values."""
    return "; ".join(f"{column}: {one_line(value)}" for column, value in row.items() if value.strip())


def one_line(value: str) -> str:
    return value.replace("\n", " ") if "\n" in value else value


# JSON.


def parse_json(text: str, budget: Budget | None = None) -> object:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"invalid JSON: {exc}") from exc
    if budget is not None and json_depth(value) > budget.depth:
        raise budget.too_deep()
    return value


def json_depth(value: object) -> int:
    """How deep the arrays and objects of a JSON value nest: 0 for a scalar."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def flatten_json(value: object) -> Iterator[str]:
    """One "path: value" line for every scalar in a JSON document, in document order."""
    # A pending child holds its parent's path and its own step, not its whole path: siblings
    # waiting on the stack share one copy of the path above them.
    stack: list[tuple[str, str, object]] = [("", "", value)]
    while stack:
        parent, step, item = stack.pop()
        path = parent + step
        children = json_children(path, item)
        if children is None:
            text = scalar_text(item)
            yield f"{path}: {text}" if path else text
        else:
            stack.extend((path, child_step, child) for child_step, child in reversed(children))


def json_children(path: str, item: object) -> list[tuple[str, object]] | None:
    if isinstance(item, dict):
        return [(f".{key}" if path else str(key), child) for key, child in item.items()]
    if isinstance(item, list):
        return [(f"[{index}]", child) for index, child in enumerate(item)]
    return None


def scalar_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# Rows.


def extract_rows(
    kind: str, data: bytes, max_bytes: int = MAX_BYTES, limits: InputLimits = DEFAULT_LIMITS, name: str = ""
) -> list[dict[str, str]] | None:
    """Rows of a tabular data item (CSV with a header row, JSON list of objects); None otherwise.

    A JSON object that holds exactly one non-empty list of objects yields that list.
    Malformed CSV or JSON, or JSON nested deeper than `limits` allows, raises InputError.
    """
    check_size(data, max_bytes)
    reader = ROW_READERS.get(kind)
    return reader(plain_text(data), Budget.of(data, limits, name)) if reader else None


def csv_rows(text: str, budget: Budget | None = None) -> list[dict[str, str]]:
    return list(csv_records(text))


def csv_records(text: str) -> Iterator[dict[str, str]]:
    """The rows of a CSV text with a header row, one at a time; blank lines are left out."""
    delimiter = pick_delimiter(text[: text.find("\n") if "\n" in text else len(text)])
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    number = 1
    try:
        for record in reader:
            if not any(cell.strip() for cell in record):
                continue
            if header is None:
                header = header_names(record)
                continue
            number += 1
            yield csv_row(header, record, number)
    except csv.Error as exc:
        raise InputError(f"bad CSV at line {reader.line_num}: {exc}") from exc
    if header is None:
        raise InputError("CSV has no header row")


def pick_delimiter(header: str) -> str:
    # Ties go to the earlier delimiter: a header with no delimiter at all is one comma-separated column.
    return max(CSV_DELIMITERS, key=lambda mark: (header.count(mark), -CSV_DELIMITERS.index(mark)))


def header_names(cells: list[str]) -> list[str]:
    names: list[str] = []
    seen: set[str] = set()
    for index, cell in enumerate(cells, start=1):
        name = cell.strip() or f"column_{index}"
        names.append(name if name not in seen else f"{name}_{index}")
        seen.add(names[-1])
    return names


def csv_row(header: list[str], record: list[str], number: int) -> dict[str, str]:
    if len(record) > len(header) and any(cell.strip() for cell in record[len(header) :]):
        raise InputError(f"bad CSV: row {number} has {len(record)} fields, the header has {len(header)}")
    return dict(zip(header, record + [""] * (len(header) - len(record)), strict=False))


def json_rows(text: str, budget: Budget) -> list[dict[str, str]] | None:
    rows = find_row_list(parse_json(text, budget))
    if rows is None:
        return None
    return [{str(key): row_value(value) for key, value in row.items()} for row in rows]


def find_row_list(value: object) -> list[dict[str, object]] | None:
    if isinstance(value, dict):
        lists = [child for child in value.values() if is_row_list(child) and child]
        return lists[0] if len(lists) == 1 else None
    return value if is_row_list(value) else None


def is_row_list(value: object) -> TypeGuard[list[dict[str, object]]]:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def row_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return scalar_text(value)


ROW_READERS: dict[str, Callable[[str, Budget], list[dict[str, str]] | None]] = {
    "csv": csv_rows,
    "json": json_rows,
}
