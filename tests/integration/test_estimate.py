"""The dry-run estimate is close to what a run then spends, on corpora of different kinds."""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
DOCUMENTS = 20
TOLERANCE = 0.3


def scifact_abstracts() -> list[tuple[str, str]]:
    """Short scientific abstracts: few names, long sentences."""
    csv.field_size_limit(1 << 24)
    with (DATA / "scifact" / "corpus_train.csv").open(newline="") as file:
        rows = [row for _, row in zip(range(DOCUMENTS), csv.DictReader(file), strict=False)]
    texts = []
    for row in rows:
        # The abstract is a list literal of sentences (numpy's print of it, without commas).
        sentences = ast.literal_eval(row["abstract"].replace("'\n '", "', '").replace("\"\n '", "\", '"))
        texts.append((f"{row['doc_id']}.txt", row["title"] + "\n\n" + " ".join(sentences)))
    return texts


def twowiki_paragraphs() -> list[tuple[str, str]]:
    """Wikipedia paragraphs: short, dense with names and dates."""
    corpus = json.loads((DATA / "twowiki_101" / "2wikimultihopqa_corpus.json").read_text())
    return [
        (f"{entry['title']}.txt", entry["title"] + "\n\n" + entry["text"]) for entry in corpus[:DOCUMENTS]
    ]


@pytest.mark.skipif(not DATA.is_dir(), reason="the shared evaluation data is not beside the project")
@pytest.mark.parametrize("read", [scifact_abstracts, twowiki_paragraphs], ids=["scifact", "2wiki"])
def test_the_estimate_is_within_30_percent_of_the_tokens_billed(
    tmp_path: Path, read: Callable[[], list[tuple[str, str]]]
) -> None:
    documents = read()
    with Simulator() as simulator:
        settings = load_settings(
            home=tmp_path / "home", embedding_provider="hash", llm_url=simulator.base_url, llm_api_key="test"
        )
        with Kenning(settings) as memory:
            # Given a dataset of real documents
            for name, text in documents:
                memory.add_text(text, "corpus", name=name)

            # When it is estimated, then cognified against the simulator
            estimate = memory.estimate("corpus")
            run = memory.cognify("corpus")
            [status] = memory.status("corpus")
            billed = simulator.stats()

    # Then the run's tokens are those the endpoint reported in its usage field
    assert run.status.value == "completed"
    spent = status["runs"][0]["tokens"]
    assert spent == {"prompt": billed["prompt_tokens"], "completion": billed["completion_tokens"]}
    # And the estimate of each kind of token is within 30% of what was spent
    assert estimate.llm_calls == billed["calls"]["chat"]
    assert estimate.prompt_tokens == pytest.approx(spent["prompt"], rel=TOLERANCE)
    assert estimate.completion_tokens == pytest.approx(spent["completion"], rel=TOLERANCE)
