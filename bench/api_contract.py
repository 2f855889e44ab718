"""The HTTP API against its own OpenAPI document, with every schemathesis check.

    python -m bench.api_contract --examples 50

Builds a temporary home (hash embeddings, one dataset cognified, an admin's API key), serves the
app with uvicorn on a free port of 127.0.0.1, and runs `schemathesis run --checks all` against
`/openapi.json` with `--examples` cases per operation, in every phase (coverage, fuzzing,
stateful). s3:// sources point at a closed local port, so nothing leaves the machine. Prints
schemathesis's report and exits with its code: 0 when every case passed every check.
`--report DIR` keeps its JUnit and NDJSON reports.

Two settings of the run, and why:
- The app's throttle of unknown API keys (429 after 20 from one address in a minute) is lifted:
  the `ignored_auth` check sends unknown keys on purpose, and the 429s that follow would leave
  the other operations untested.
- One kind of failure is dropped, by the `filter_failure` hook below: "schema-violating request
  accepted" on a multipart/form-data upload whose fields, as sent, are valid. A form field is
  text, so a number generated for a text field arrives as valid text; schemathesis cannot
  re-check such a body (its file parts are bytes, which its validator does not read), so the
  hook re-checks it as the server reads it. A body that is invalid as sent still fails.

The suite runs the same with a few examples (tests/integration/test_api_contract.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any, NamedTuple

import jsonschema  # type: ignore[import-untyped]
import schemathesis
import uvicorn
from schemathesis.core.failures import AcceptedNegativeData

from bench.api_load import admin_key
from kenning.pipeline.permission import User, authenticate
from kenning.workers.api import create_app
from kenning.workers.api.access import AuthThrottle
from kenning.workers.api.routes import MULTIPART_SCHEMA
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
SETTINGS: dict[str, Any] = {
    "embedding_provider": "hash",
    "s3_endpoint_url": "http://127.0.0.1:9",
    "api_max_upload_bytes": 64 * 1024,
}
# A body over the size limit is refused before it is read (413): as much a rejection as a 422.
# Half the datasets, users, entities, sessions and session entries named are ones the home holds, so
# that the routes on them reach their logic, not only their 404.
CONFIG = """\
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "413", "415", "422"]

[dictionaries.datasets]
values = ["main"]

[dictionaries.users]
values = ["bob"]

[dictionaries.entities]
values = ["Ada Lovelace"]

[dictionaries.sessions]
values = ["{session}"]

[dictionaries.entries]
values = ["{entry}"]

[parameters]
"path.dataset" = {{ dictionary = "datasets", probability = 0.5 }}
"path.user" = {{ dictionary = "users", probability = 0.5 }}
"body.user" = {{ dictionary = "users", probability = 0.5 }}
"query.entity" = {{ dictionary = "entities", probability = 0.5 }}
"path.session_id" = {{ dictionary = "sessions", probability = 0.5 }}
"path.entry_id" = {{ dictionary = "entries", probability = 0.5 }}
"body.entry_id" = {{ dictionary = "entries", probability = 0.5 }}
"""
START_TIMEOUT_S = 30.0
# This module, by its import name (run as a script, its `__name__` is `__main__`).
HOOKS = "bench.api_contract"


class Served(NamedTuple):
    """The app's URL, an admin's API key, and a session of that admin with one entry."""

    url: str
    token: str
    session: str
    entry: str


@contextmanager
def served(home: Path) -> Iterator[Served]:
    """The app on 127.0.0.1 over a new home: a cognified dataset `main`, an admin with a key and a
    session `s1` of one message, and a user `bob`."""
    with Kenning(load_settings(home=home, **SETTINGS)) as memory:
        memory.add_text("Ada Lovelace wrote the first program for the Analytical Engine.", "main")
        memory.cognify("main")
        token, _ = admin_key(memory)
        memory.wiring.permissions.add_user(User(tenant=memory.settings.tenant, name="bob"))
        admin = authenticate(memory.wiring.permissions, token)
        assert admin is not None
        as_admin = memory.as_caller(admin)
        as_admin.remember("I wrote the first program.", "main", "s1")
        entry = as_admin.get_session("s1")[-1].id
        app = create_app(memory)
        app.state.kenning.throttle = AuthThrottle(max_failures=sys.maxsize)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        listener.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        try:
            if not _started(server, thread):
                raise RuntimeError("the API did not start")
            yield Served(f"http://127.0.0.1:{listener.getsockname()[1]}", token, "s1", entry)
        finally:
            server.should_exit = True
            thread.join(START_TIMEOUT_S)
            listener.close()


def _started(server: uvicorn.Server, thread: threading.Thread) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.started


def schemathesis_run(app: Served, examples: int, workdir: Path, *extra: str) -> int:
    """`schemathesis run --checks all` against the served app, in `workdir` (its cache goes
    there); its exit code."""
    config = workdir / "schemathesis.toml"
    config.write_text(CONFIG.format(session=app.session, entry=app.entry))
    url, token = app.url, app.token
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "--config-file",
        str(config),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(examples),
        "--header",
        f"Authorization: Bearer {token}",
        "--generation-database",
        "none",
        *extra,
    ]
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "SCHEMATHESIS_HOOKS": HOOKS, "PYTHONPATH": python_path, "NO_COLOR": "1"}
    return subprocess.run(command, env=env, cwd=workdir, check=False).returncode


@schemathesis.hook
def filter_failure(_context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but "schema-violating request accepted" for a form that is valid as sent."""
    if not isinstance(failure, AcceptedNegativeData) or case.media_type != "multipart/form-data":
        return True
    body = response.request.body
    content_type = response.request.headers.get("Content-Type", "")
    return not isinstance(body, bytes) or not form_valid_as_sent(body, content_type)


def form_valid_as_sent(body: bytes, content_type: str) -> bool:
    """Whether a multipart/form-data upload, read as the server reads it (parts with a file name
    are files, the others text), matches the upload's schema."""
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields: dict[str, list[str]] = {}
    for part in message.iter_parts():
        name = str(part.get_param("name", header="content-disposition"))
        payload = part.get_payload(decode=True)
        if part.get_filename() is not None:
            fields.setdefault(name, []).append("a file")
        elif name != "files" and isinstance(payload, bytes):
            fields.setdefault(name, []).append(payload.decode(errors="replace"))
    form: dict[str, Any] = {name: one_or_all(values) for name, values in fields.items()}
    if "files" in fields:
        form["files"] = fields["files"]
    return bool(jsonschema.Draft202012Validator(MULTIPART_SCHEMA).is_valid(form))


def one_or_all(values: list[str]) -> str | list[str]:
    """A form field sent once is one value; sent several times, a list."""
    return values[0] if len(values) == 1 else values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=50, help="cases per operation")
    parser.add_argument("--seed", type=int, default=1, help="the generation seed (reproducible runs)")
    parser.add_argument("--report", type=Path, default=None, help="a folder for JUnit and NDJSON reports")
    args = parser.parse_args()
    extra = ["--seed", str(args.seed)]
    if args.report:
        extra += ["--report", "junit,ndjson", "--report-dir", str(args.report.resolve())]
    with tempfile.TemporaryDirectory(prefix="kenning-api-contract-") as tmp:
        with served(Path(tmp) / "home") as app:
            code = schemathesis_run(app, args.examples, Path(tmp), *extra)
    sys.exit(code)


if __name__ == "__main__":
    main()
