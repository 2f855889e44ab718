"""Loaders: raw bytes of a data item -> its kind, its plain text, and its rows when it is tabular."""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import TypeGuard

from selectolax.lexbor import LexborHTMLParser

from kenning.pipeline.errors import InputError

MAX_BYTES = 64 * 1024 * 1024
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


def detect_kind(name: str, data: bytes, max_bytes: int = MAX_BYTES) -> str:
    """One of KINDS for a data item, from its name's extension and its content.

    Binary formats are recognised by content whatever the name says; a name without a
    known extension (stdin is `-`) is sniffed. Empty, binary or unsupported content
    raises InputError.
    """
    check_size(data, max_bytes)
    if not data or data.isspace():
        raise InputError("empty file")
    binary = detect_binary(name, data)
    if binary:
        return binary
    claimed = EXTENSION_KINDS.get(extension(name))
    if claimed in ("pdf", "docx"):
        raise InputError(f"{name} is named as {claimed} but its content is not {claimed}")
    text = decode_bytes(data)
    if not text.strip():
        raise InputError("empty file")
    if claimed == "json":
        parse_json(text)
    return claimed or sniff_text(name, text)


def extension(name: str) -> str:
    return PurePosixPath(name.replace("\\", "/")).suffix.lower()


def detect_binary(name: str, data: bytes) -> str | None:
    if data.startswith(b"%PDF-") or (extension(name) == ".pdf" and b"%PDF-" in data[:1024]):
        return "pdf"
    if data.startswith(b"PK\x03\x04"):
        return detect_zip(data)
    for magic, label in BINARY_MAGIC.items():
        if data.startswith(magic):
            raise InputError(f"unsupported binary format: {label}")
    return None


def detect_zip(data: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise InputError(f"corrupt or truncated zip archive: {exc}") from exc
    if "word/document.xml" not in names:
        raise InputError("unsupported binary format: zip archive that is not a .docx document")
    return "docx"


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


def extract_text(kind: str, data: bytes, max_bytes: int = MAX_BYTES) -> str:
    """Plain text of a data item of the given kind; InputError when none can be had."""
    check_size(data, max_bytes)
    extractor = EXTRACTORS.get(kind)
    if extractor is None:
        raise InputError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    text = extractor(data)
    if not text.strip():
        raise InputError("no text could be extracted")
    return text


def plain_text(data: bytes) -> str:
    return normalize_newlines(decode_bytes(data))


def markdown_text(data: bytes) -> str:
    # The parsers of rarer formats are imported on first use: together they take about a second.
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(plain_text(data))
    return html_to_text(html)


def rst_text(data: bytes) -> str:
    lines = (clean_rst_line(line) for line in plain_text(data).split("\n") if not is_rst_markup(line))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def is_rst_markup(line: str) -> bool:
    return any(pattern.match(line) for pattern in (RST_DIRECTIVE, RST_COMMENT, RST_OPTION, RST_ADORNMENT))


def clean_rst_line(line: str) -> str:
    for pattern, replacement in RST_INLINE:
        line = pattern.sub(replacement, line)
    return line.rstrip()


def html_text(data: bytes) -> str:
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


def pdf_text(data: bytes) -> str:
    from pypdf import PasswordType, PdfReader

    # pypdf raises many exception types on damaged files; all of them mean the same to a caller.
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise InputError("encrypted PDF: a password is needed to read it")
        return "\n\n".join(page.extract_text() for page in reader.pages)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"corrupt or unreadable PDF: {exc}") from exc


def docx_text(data: bytes) -> str:
    import docx

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


def csv_text(data: bytes) -> str:
    lines = (format_row(row) for row in csv_rows(plain_text(data)))
    return "\n".join(line for line in lines if line)


def json_text(data: bytes) -> str:
    return "\n".join(flatten_json(parse_json(plain_text(data))))


EXTRACTORS: dict[str, Callable[[bytes], str]] = {
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


def parse_json(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"invalid JSON: {exc}") from exc


def flatten_json(value: object) -> Iterator[str]:
    """One "path: value" line for every scalar in a JSON document, in document order."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        children = json_children(path, item)
        if children is None:
            text = scalar_text(item)
            yield f"{path}: {text}" if path else text
        else:
            stack.extend(reversed(children))


def json_children(path: str, item: object) -> list[tuple[str, object]] | None:
    if isinstance(item, dict):
        return [(f"{path}.{key}" if path else str(key), child) for key, child in item.items()]
    if isinstance(item, list):
        return [(f"{path}[{index}]", child) for index, child in enumerate(item)]
    return None


def scalar_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# Rows.


def extract_rows(kind: str, data: bytes, max_bytes: int = MAX_BYTES) -> list[dict[str, str]] | None:
    """Rows of a tabular data item (CSV with a header row, JSON list of objects); None otherwise.

    A JSON object that holds exactly one non-empty list of objects yields that list.
    Malformed CSV or JSON raises InputError.
    """
    check_size(data, max_bytes)
    reader = ROW_READERS.get(kind)
    return reader(plain_text(data)) if reader else None


def csv_rows(text: str) -> list[dict[str, str]]:
    delimiter = pick_delimiter(text[: text.find("\n") if "\n" in text else len(text)])
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, strict=True)
    try:
        records = [record for record in reader if any(cell.strip() for cell in record)]
    except csv.Error as exc:
        raise InputError(f"bad CSV at line {reader.line_num}: {exc}") from exc
    if not records:
        raise InputError("CSV has no header row")
    header = header_names(records[0])
    return [csv_row(header, record, number) for number, record in enumerate(records[1:], start=2)]


def pick_delimiter(header: str) -> str:
    # Ties go to the earlier delimiter: a header with no delimiter at all is one comma-separated column.
    return max(CSV_DELIMITERS, key=lambda mark: (header.count(mark), -CSV_DELIMITERS.index(mark)))


def header_names(cells: list[str]) -> list[str]:
    names: list[str] = []
    for index, cell in enumerate(cells, start=1):
        name = cell.strip() or f"column_{index}"
        names.append(name if name not in names else f"{name}_{index}")
    return names


def csv_row(header: list[str], record: list[str], number: int) -> dict[str, str]:
    if len(record) > len(header) and any(cell.strip() for cell in record[len(header) :]):
        raise InputError(f"bad CSV: row {number} has {len(record)} fields, the header has {len(header)}")
    return dict(zip(header, record + [""] * (len(header) - len(record)), strict=False))


def json_rows(text: str) -> list[dict[str, str]] | None:
    rows = find_row_list(parse_json(text))
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


ROW_READERS: dict[str, Callable[[str], list[dict[str, str]] | None]] = {"csv": csv_rows, "json": json_rows}
