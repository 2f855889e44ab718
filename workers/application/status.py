"""What a caller is shown of its datasets: items by status, failures, graph size, recent runs, and
the LLM calls, tokens and cost of each run and of the dataset (from the spend ledger): its runs'
extractions and the completions of the searches that read it. A search of several datasets is
charged to each of them; their `total` counts each request once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kenning.pipeline.context import Job
from kenning.pipeline.estimate import Estimate, estimate, price
from kenning.pipeline.models import ChunkStatus, Dataset, ItemStatus, PipelineRun, RunStatus
from kenning.pipeline.spend import KINDS, Spend
from kenning.workers.application import gate
from kenning.workers.application.context import Context
from kenning.workers.application.lifecycle import find_dataset
from kenning.workers.runtime.local_runner import close_dead_runs

SPEND_COUNTERS = ("llm_calls", "prompt_tokens", "completion_tokens")


def status(context: Context, dataset: str | None = None) -> list[dict[str, Any]]:
    """See `Kenning.status`: the datasets named (or every one) the caller may read."""
    return [dataset_status(context, d) for d in visible_datasets(context, dataset)]


def visible_datasets(context: Context, dataset: str | None) -> list[Dataset]:
    metadata, caller = context.wiring.metadata, context.caller
    if dataset:
        return [find_dataset(metadata, caller.tenant, dataset, lambda d: gate.may_read(caller, d.scope))]
    return [d for d in metadata.list_datasets(caller.tenant) if gate.may_read(caller, d.scope)]


def dataset_status(context: Context, dataset: Dataset) -> dict[str, Any]:
    metadata = context.wiring.metadata
    close_dead_runs(metadata, dataset.id)
    items = metadata.list_items(dataset.id)
    runs = sorted(metadata.list_runs(dataset.id), key=lambda r: r.started_at, reverse=True)
    nodes, edges = context.wiring.graph.counts(dataset.scope)
    in_ledger = context.wiring.spend.totals([run.id for run in runs])
    spent = spent_by_run(runs, in_ledger)
    kinds = spent_by_kind(context, dataset, [run for run in runs if run.id not in in_ledger], spent)
    total: Counter[str] = Counter()
    for counted in kinds.values():
        total.update(counted)
    return {
        "dataset": dataset.name,
        "tenant": dataset.tenant,
        "items": dict(Counter(item.status.value for item in items)),
        "errors": {item.name: item.error for item in items if item.status == ItemStatus.FAILED},
        "failed_chunks": failed_chunks(context, dataset.id, {item.id: item.name for item in items}),
        "graph": {"nodes": nodes, "edges": edges},
        "llm_calls": total["llm_calls"],
        **priced(context, total),
        "spend": {
            kind: {"llm_calls": counted["llm_calls"], **priced(context, counted)}
            for kind, counted in kinds.items()
        },
        "runs": [
            {
                **run.model_dump(mode="json"),
                **priced(context, spent[run.id]),
                "llm_calls": spent[run.id]["llm_calls"],
            }
            for run in runs[:5]
        ],
    }


def total(context: Context, dataset: str | None = None) -> dict[str, Any]:
    """The LLM calls, tokens and cost of the datasets `status` shows, each request counted once
    (a search of several of them is in each one's figures): what the provider billed for them."""
    datasets = visible_datasets(context, dataset)
    spend = context.wiring.spend
    counted: Counter[str] = Counter()
    for kind in spend.across([d.id for d in datasets]).values():
        counted.update(_counters(kind))
    for d in datasets:  # runs made before the ledger, by their own counters
        runs = context.wiring.metadata.list_runs(d.id)
        in_ledger = spend.totals([run.id for run in runs])
        for counters in spent_by_run([run for run in runs if run.id not in in_ledger], {}).values():
            counted.update(counters)
    return {"llm_calls": counted["llm_calls"], **priced(context, counted)}


def spent_by_run(runs: Sequence[PipelineRun], ledger: Mapping[str, Spend]) -> dict[str, dict[str, int]]:
    """Each run's LLM calls and tokens: every attempt recorded in the spend ledger (`ledger`, its
    totals: retries, and calls of tasks that were killed, included); the run's own counters for
    runs made before it."""
    return {
        run.id: _counters(ledger[run.id])
        if run.id in ledger
        else {name: run.stats.get(name, 0) for name in SPEND_COUNTERS}
        for run in runs
    }


def spent_by_kind(
    context: Context, dataset: Dataset, unknown: Sequence[PipelineRun], by_run: dict[str, dict[str, int]]
) -> dict[str, Counter[str]]:
    """The dataset's LLM calls and tokens by kind: its runs' extractions and the completions of the
    searches charged to it, from the ledger; and the runs it does not know (`unknown`, made before
    it), by their own counters."""
    ledger = context.wiring.spend.by_dataset([dataset.id]).get(dataset.id, {})
    counted: dict[str, Counter[str]] = {kind: Counter(_counters(ledger.get(kind, Spend()))) for kind in KINDS}
    for run in unknown:
        counted["extraction"].update(by_run[run.id])
    return counted


def _counters(spend: Spend) -> dict[str, int]:
    return {
        "llm_calls": spend.calls,
        "prompt_tokens": spend.prompt_tokens,
        "completion_tokens": spend.completion_tokens,
    }


def failed_chunks(context: Context, dataset_id: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """Each chunk whose extraction failed: its item, position and the reason."""
    chunks = context.wiring.chunks
    failed = chunks.get_chunks(chunks.list_chunk_ids(dataset_id, ChunkStatus.FAILED))
    return [
        {"item": names.get(c.data_id, c.data_id), "chunk_id": c.id, "index": c.index, "error": c.error}
        for c in failed
    ]


def priced(context: Context, stats: Mapping[str, int]) -> dict[str, Any]:
    prompt, completion = stats.get("prompt_tokens", 0), stats.get("completion_tokens", 0)
    settings = context.settings
    return {
        "tokens": {"prompt": prompt, "completion": completion},
        "cost": price(
            prompt, completion, settings.llm_price_prompt_per_1k, settings.llm_price_completion_per_1k
        ),
    }


def cost_estimate(context: Context, dataset: str | None = None) -> Estimate:
    """LLM calls, tokens and cost the next cognify of the dataset would spend; writes nothing."""
    settings = context.settings
    found = estimate(context.wiring, context.scope(dataset))
    return found.price(settings.llm_price_prompt_per_1k, settings.llm_price_completion_per_1k)


def started_jobs(context: Context, dataset: str | None = None) -> list[Job]:
    """The runs now started, of the dataset or of every dataset of the tenant."""
    metadata = context.wiring.metadata
    wanted = [d for d in metadata.list_datasets(context.caller.tenant) if not dataset or d.name == dataset]
    for d in wanted:
        close_dead_runs(metadata, d.id)
    return [
        Job(run_id=run.id, dataset_id=d.id, tenant=d.tenant, dataset=d.name)
        for d in wanted
        for run in metadata.list_runs(d.id)
        if run.status == RunStatus.STARTED
    ]
