"""The built wheel: `kenning/` alone, installable with the local extra, `kenning demo` from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import ROOT

pytestmark = pytest.mark.slow
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk; pip would otherwise pick a CUDA one


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)], cwd=ROOT)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = out.glob("kenning-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv holding the wheel with its `local` extra, and nothing from the checkout."""
    where = tmp_path_factory.mktemp("venv")
    assert run([sys.executable, "-m", "venv", str(where)], cwd=where).returncode == 0
    # --no-compile: the demo compiles what it imports (byte-compiling everything took 26 s more).
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    for packages in ([TORCH], [f"{wheel}[local]"]):
        installed = run([*pip, *packages], cwd=where)
        assert installed.returncode == 0, installed.stderr[-3000:]
    yield where


def outside_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("KENNING_")}
    env.pop("PYTHONPATH", None)
    return {**env, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true"}


def test_the_wheel_holds_kenning_alone(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"kenning", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for data_file in (
        "kenning/py.typed",
        "kenning/workers/samples/the-lamp.md",
        "kenning/workers/assets/graph_view.html",
        "kenning/storage/inference/minilm_graph.onnx",
        "kenning/storage/metadata/migrations/env.py",
        "kenning/storage/metadata/migrations/script.py.mako",
        "kenning/storage/metadata/migrations/versions/0001_initial.py",
    ):
        assert data_file in names
    # The LLM simulator serves tests and benchmarks: it is not part of the product
    assert not [name for name in names if "simulator" in name]


def test_demo_runs_from_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    # Given a directory outside the checkout and the wheel installed with only the local extra
    kenning = str(venv / "bin" / "kenning")
    # When the demo runs there
    demo = run([kenning, "demo"], cwd=tmp_path, env=outside_env())
    # Then it ingests and answers from the installed package
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "completed" in demo.stdout + demo.stderr and "Q: " in demo.stdout
    version = run([kenning, "--version"], cwd=tmp_path, env=outside_env())
    assert version.stdout.startswith("kenning, version ")
    bare = run([str(venv / "bin" / "python"), "-c", "import pipeline"], cwd=tmp_path, env=outside_env())
    assert "No module named 'pipeline'" in bare.stderr


def test_a_server_feature_without_its_extra_names_the_extra(venv: Path, tmp_path: Path) -> None:
    # A worker needs celery, which only the `server` extra installs
    worker = run([str(venv / "bin" / "kenning"), "worker"], cwd=tmp_path, env=outside_env())
    assert worker.returncode == 2
    assert "kenning[server]" in worker.stdout + worker.stderr


def test_mcp_without_its_extra_names_the_extra(venv: Path, tmp_path: Path) -> None:
    # The MCP server needs the SDK, which only the `mcp` extra installs
    served = run([str(venv / "bin" / "kenning"), "mcp"], cwd=tmp_path, env=outside_env())
    assert served.returncode == 2
    assert "kenning[mcp]" in served.stdout + served.stderr
