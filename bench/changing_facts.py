"""Facts that change over time, scored exactly: a generated world of people who move and change
jobs (and some who stop working somewhere) and of companies whose CEO changes, told as dated
chat messages (with visits and meetings that change nothing) and dated news documents, loaded
in no particular order and remembered offline (no LLM, hashed embeddings), then asked for the
current value, the value as of a date, and the history.

    python -m bench.changing_facts                       # 200 people, 30 companies, seed 7
    python -m bench.changing_facts --people 400 --seed 3
    python -m bench.changing_facts --llm simulator --teams 60

With `--llm simulator` the project's LLM simulator (in this process) extracts, and the load step
also asks it which facts a new fact ends (`KENNING_FACTS_LLM`, `kenning.pipeline.contradiction`);
`llm` then says how many calls each part made. With `--teams N`, N of the people also play for
football teams and change team now and then ("I play for Harbour United now."): a relation no
offline rule knows, scored apart as `beyond_rules` (its world is drawn with its own generator, so
the rest of the world is the same with or without it).

Each answer is read from `Kenning.history(entity, as_of=...)`: the values of the asked relation
(lives in, works for, holds the office "CEO of X") among the facts that hold now or held at the
date. An answer is right when it is exactly the true value (or nothing, for someone who works
nowhere). History completeness is the share of the true periods (value, start, end) that kenning
has with the same start and end. `piled_up` scores the same answers with every fact ever stated
counted as current (as of a date: every fact stated by then), which is what memory without
retirement answers. Prints one JSON object (also written to bench/results/changing_facts.json).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from kenning.pipeline.contradiction import (
    ENDED_BY_JUDGMENT,
    JUDGMENTS,
    JUDGMENTS_FAILED,
    NEW_LEFT_OUT,
    PAIRS_LEFT_OUT,
    UNKNOWN_IDS,
)
from kenning.pipeline.ingest import text_source
from kenning.pipeline.validity import Fact, FactRules
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator

FIRST = [
    "Ana", "Bruno", "Carla", "Dario", "Elin", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lars",
    "Mira", "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tilde", "Umar", "Vera", "Wim", "Yara", "Zeno",
]  # fmt: skip
LAST = [
    "Lopez", "Berg", "Quill", "Marsh", "Vale", "Hollow", "Pike", "Harrow", "Reed", "Stone", "Frost",
    "Weller", "Okafor", "Lindqvist", "Moreau", "Castell", "Brandt", "Novak", "Sato", "Keller",
]  # fmt: skip
EXECUTIVES = [
    "Agnes Thorne", "Basil Crane", "Celia Wren", "Dorian Hale", "Edda Vorn", "Felix Ambry", "Gemma Stroud",
    "Henrik Dahl", "Isolde Marr", "Jasper Quade", "Katya Orlov", "Leopold Finch", "Maren Solberg",
    "Nadia Ferro", "Oskar Lund", "Petra Vance", "Quentin Roux", "Rhea Calder", "Sorin Petrescu",
    "Talia Boone", "Ulrich Rast", "Vivian Kerr", "Wendell Hart", "Xenia Pruitt", "Yusuf Adler",
    "Zora Kincaid", "Aurelio Banks", "Brigid Nolan", "Cassius Ward", "Delphine Rook", "Emrys Vaughn",
    "Fenna Bright", "Gideon Sallow", "Hester Vane", "Ivo Mercer", "Jolene Pratt", "Kasimir Holt",
    "Liesel Brook", "Magnus Treve", "Noor Haddad", "Orla Quinn", "Piet Vos", "Quilla Ross", "Ruben Salo",
]  # fmt: skip
CITIES = [
    "Oslo", "Bergen", "Lyon", "Porto", "Graz", "Turku", "Malmo", "Ghent", "Bremen", "Leeds", "Cork",
    "Basel", "Tartu", "Split", "Brno", "Aarhus", "Lille", "Bilbao", "Parma", "Kassel", "Utrecht",
    "Gdansk", "Pecs", "Kaunas", "Trondheim", "Uppsala", "Nantes", "Murcia", "Verona", "Leipzig",
    "Galway", "Lugano", "Ljubljana", "Riga", "Tampere", "Odense", "Rennes", "Toledo", "Genoa", "Freiburg",
]  # fmt: skip
COMPANIES = [
    "Norsk Data", "Vireo Systems", "Kestrel Labs", "Halcyon Works", "Brightwater Tools", "Corvid Analytics",
    "Lumen Forge", "Marlow Dynamics", "Nimbus Freight", "Orchid Biotech", "Pylon Energy", "Quarry Logic",
    "Redfern Media", "Saltire Robotics", "Tamarind Foods", "Umbra Security", "Vantage Optics",
    "Wyvern Aero", "Yarrow Textiles", "Zephyr Mobility", "Alder Finance", "Bramble Games", "Cobalt Mills",
    "Dunmore Health", "Ember Networks", "Fjord Shipping", "Granite Cloud", "Heron Studios",
    "Ironwood Motors", "Juniper Pharma",
]  # fmt: skip
TEAMS = [
    "Celtic Rovers", "Harbour United", "Northgate Athletic", "Riverside Wanderers", "Kingsbridge Town",
    "Eastport Rangers", "Millbrook Albion", "Westfield Harriers", "Stonebridge Celtic", "Ashford Villa",
]  # fmt: skip
START, END = date(2020, 1, 1), date(2024, 12, 31)
NOW = "now"


@dataclass
class Timeline:
    """One relation of one entity: (start moment, value or "" for none), in time order."""

    changes: list[tuple[str, str]] = field(default_factory=list)

    def at(self, day: date) -> str | None:
        """The value at the end of `day` (None before the first change)."""
        found = None
        for moment, value in self.changes:
            if _start(moment) <= day:
                found = value
        return found

    def periods(self) -> list[tuple[str, str, str | None]]:
        """(value, start, end) of every stretch with a value."""
        result = []
        for number, (moment, value) in enumerate(self.changes):
            following = self.changes[number + 1][0] if number + 1 < len(self.changes) else None
            if value:
                result.append((value, moment, following))
        return result


def _start(moment: str) -> date:
    parts = [int(part) for part in moment.split("-")]
    return date(*(parts + [1, 1])[:3])


@dataclass
class World:
    texts: list[tuple[str, str]] = field(default_factory=list)  # (name, text)
    cities: dict[str, Timeline] = field(default_factory=dict)
    employers: dict[str, Timeline] = field(default_factory=dict)
    ceos: dict[str, Timeline] = field(default_factory=dict)
    teams: dict[str, Timeline] = field(default_factory=dict)


def generate(people: int, rng: random.Random) -> World:
    """People moving and changing jobs month by month, and CEO successions, as dated texts."""
    names = [f"{first} {last}" for last in LAST for first in FIRST]
    rng.shuffle(names)
    if people > len(names):
        raise SystemExit(f"at most {len(names)} people")
    world = World()
    for name in names[:people]:
        _live(world, name, rng)
    executives = sorted({f"{a.split()[0]} {b.split()[1]}" for a in EXECUTIVES for b in EXECUTIVES})
    rng.shuffle(executives)
    for company in COMPANIES:
        _succeed(world, company, [executives.pop() for _ in range(rng.randint(1, 3))], rng)
    return world


def play(world: World, players: int, rng: random.Random) -> None:
    """`players` of the world's people play for a team, and change team now and then."""
    for name in sorted(world.cities)[:players]:
        team = rng.choice(TEAMS)
        first = START + timedelta(days=rng.randrange(0, 200))
        timeline = Timeline([(first.isoformat(), team)])
        say = _speaker(world, name)
        say(first, f"I play for {team}.")
        month = date(first.year, first.month, 1)
        while (month := _next_month(month)) <= END:
            day = month + timedelta(days=rng.randrange(2, 26))
            if day <= END and rng.random() < 0.06:
                team = rng.choice([t for t in TEAMS if t != team])
                timeline.changes.append((day.isoformat(), team))
                say(day, f"I play for {team} now.")
        world.teams[name] = timeline


def _live(world: World, name: str, rng: random.Random) -> None:
    city, employer = rng.choice(CITIES), rng.choice(COMPANIES)
    first = START + timedelta(days=rng.randrange(0, 150))
    cities, jobs = Timeline([(first.isoformat(), city)]), Timeline([(first.isoformat(), employer)])
    say = _speaker(world, name)
    say(first, f"I live in {city} and work for {employer}.")
    month = date(first.year, first.month, 1)
    while True:
        month = _next_month(month)
        day = month + timedelta(days=rng.randrange(2, 26))
        if day > END:
            break
        draw = rng.random()
        if draw < 0.05:
            city = rng.choice([c for c in CITIES if c != city])
            if rng.random() < 0.2:  # told the month after, as "last month"
                told = _next_month(month) + timedelta(days=rng.randrange(2, 26))
                if told > END:
                    break
                cities.changes.append((f"{month.year:04}-{month.month:02}", city))
                say(told, f"We moved to {city} last month.")
                month = _next_month(month)
            else:
                cities.changes.append((day.isoformat(), city))
                say(day, f"I moved to {city}.")
        elif draw < 0.09:
            employer = rng.choice([c for c in COMPANIES if c != employer])
            jobs.changes.append((day.isoformat(), employer))
            say(day, rng.choice([f"I joined {employer}.", f"I started working at {employer}."]))
        elif draw < 0.11 and employer:
            say(day, f"I no longer work for {employer}.")
            employer = ""
            jobs.changes.append((day.isoformat(), ""))
        elif draw < 0.13:
            say(day, f"I still live in {city}.")
        elif draw < 0.17:  # a place visited and a company met are no change of home or employer
            other, partner = rng.choice(CITIES), rng.choice(COMPANIES)
            say(
                day, rng.choice([f"I visited {other} last week.", f"I met people from {partner} in {other}."])
            )
    world.cities[name], world.employers[name] = cities, jobs


def _speaker(world: World, name: str) -> Any:
    def say(day: date, words: str) -> None:
        world.texts.append((f"{name} {day.isoformat()}", f"[{day.isoformat()}] {name}: {words}"))

    return say


def _next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def _succeed(world: World, company: str, holders: list[str], rng: random.Random) -> None:
    office = f"CEO of {company}"
    days = sorted(START + timedelta(days=rng.randrange(0, (END - START).days)) for _ in holders)
    days[0] = START + timedelta(days=rng.randrange(0, 60))
    timeline = Timeline()
    for number, (holder, day) in enumerate(zip(holders, days, strict=True)):
        if timeline.changes and timeline.changes[-1][0] == day.isoformat():
            continue
        words = (
            f"{holder} is the CEO of {company}." if number == 0 else f"{holder} became the CEO of {company}."
        )
        world.texts.append((f"{company} {day.isoformat()}", f"{day.isoformat()}\n{words}"))
        timeline.changes.append((day.isoformat(), holder))
    world.ceos[office] = timeline


@dataclass(frozen=True)
class Question:
    kind: str  # current, as_of, history
    entity: str
    relation: str  # lives_in, works_for, holds_office
    day: date | None = None


def questions(world: World, rng: random.Random) -> list[Question]:
    asked = []
    for name in world.cities:
        asked += [Question("current", name, "lives_in"), Question("current", name, "works_for")]
        asked += [Question("as_of", name, "lives_in", _some_day(rng)) for _ in range(2)]
        asked += [Question("as_of", name, "works_for", _some_day(rng))]
        asked += [Question("history", name, "lives_in"), Question("history", name, "works_for")]
    for office in world.ceos:
        asked += [Question("current", office, "holds_office")]
        asked += [Question("as_of", office, "holds_office", _some_day(rng)) for _ in range(3)]
    return asked


def _some_day(rng: random.Random) -> date:
    return date(2020, 7, 1) + timedelta(days=rng.randrange(0, (END - date(2020, 7, 1)).days))


def team_questions(world: World, rng: random.Random) -> list[Question]:
    asked = []
    for name in world.teams:
        asked += [Question("current", name, "play_for"), Question("as_of", name, "play_for", _some_day(rng))]
        asked += [Question("history", name, "play_for")]
    return asked


def truth_of(world: World, question: Question) -> Timeline:
    if question.relation == "play_for":
        return world.teams[question.entity]
    if question.relation == "lives_in":
        return world.cities[question.entity]
    if question.relation == "works_for":
        return world.employers[question.entity]
    return world.ceos[question.entity]


def values(facts: Sequence[Fact], question: Question, rules: FactRules) -> set[str]:
    """The values of the asked relation among `facts`."""
    found = set()
    for fact in facts:
        if rules.family(fact.relationship, fact.target) != question.relation:
            continue
        found.add(fact.source if question.relation == "holds_office" else fact.target)
    return found


def score(memory: Kenning, world: World, asked: list[Question], dataset: str) -> dict[str, Any]:
    rules = FactRules()
    right: dict[str, list[bool]] = {"current": [], "as_of": []}
    piled: dict[str, list[bool]] = {"current": [], "as_of": []}
    periods_found = periods_total = 0
    cache: dict[str, list[Fact]] = {}
    for question in asked:
        truth = truth_of(world, question)
        every = cache.setdefault(question.entity, memory.history(question.entity, dataset))
        if question.kind == "history":
            have = {
                (value, period.valid_from, period.valid_to)
                for fact in every
                for value in values([fact], question, rules)
                for period in fact.periods
            }
            true_periods = truth.periods()
            periods_total += len(true_periods)
            periods_found += sum(1 for period in true_periods if period in have)
            continue
        if question.kind == "current":
            expected = truth.changes[-1][1]
            held = [fact for fact in every if fact.current]
            stated = list(every)
        else:
            assert question.day is not None
            expected = truth.at(question.day) or ""
            moment = question.day.isoformat()
            held = [fact for fact in every if fact.held_at(moment)]
            stated = [f for f in every if f.periods and _start(f.periods[0].valid_from[:10]) <= question.day]
        want = {expected} if expected else set()
        right[question.kind].append(values(held, question, rules) == want)
        piled[question.kind].append(values(stated, question, rules) == want)
    return {
        "current_accuracy": _share(right["current"]),
        "as_of_accuracy": _share(right["as_of"]),
        "history_completeness": round(periods_found / periods_total, 4) if periods_total else None,
        "piled_up": {"current_accuracy": _share(piled["current"]), "as_of_accuracy": _share(piled["as_of"])},
        "questions": {kind: len(found) for kind, found in right.items()}
        | {"history": sum(q.kind == "history" for q in asked)},
        "history_periods": periods_total,
    }


def _share(found: list[bool]) -> float | None:
    return round(sum(found) / len(found), 4) if found else None


def run(people: int, seed: int, home: Path, llm: str = "offline", teams: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    world = generate(people, rng)
    asked = questions(world, rng)
    team_rng = random.Random(f"teams-{seed}")
    play(world, teams, team_rng)
    beyond = team_questions(world, team_rng)
    texts = list(world.texts)
    rng.shuffle(texts)  # loaded in no particular order: periods follow from the texts' own times
    with ExitStack() as stack:
        options: dict[str, Any] = {}
        if llm == "simulator":
            simulator = stack.enter_context(Simulator())
            options = {"llm_url": simulator.base_url, "llm_api_key": "bench", "facts_llm": True}
        settings = load_settings(home=home, embedding_provider="hash", **options)
        memory = stack.enter_context(Kenning(settings))
        started = time.perf_counter()
        memory.add([text_source(text, name=name) for name, text in texts], "changes")
        run = memory.cognify("changes")
        ingest_s = time.perf_counter() - started
        started = time.perf_counter()
        scored = score(memory, world, asked, "changes")
        beyond_scored = score(memory, world, beyond, "changes") if beyond else None
        nodes, edges = memory.wiring.graph.export(memory.scope("changes"))
        [status] = memory.status("changes")
        calls = simulator.stats()["calls"].get("chat", 0) if llm == "simulator" else 0
    timed = [edge for edge in edges if edge.properties.get("periods")]
    result = {
        "benchmark": "changing_facts",
        "mode": MODES[llm],
        "seed": seed,
        "people": people,
        "companies": len(world.ceos),
        "entities": len({*world.cities, *world.ceos, *CITIES, *COMPANIES}),
        "texts": len(texts),
        "questions_total": len(asked),
        **scored,
        "run_status": run.status.value,
        "facts": len(timed),
        "facts_retired": sum(1 for edge in timed if edge.properties["periods"][-1].get("to")),
        "ingest_s": round(ingest_s, 2),
        "score_s": round(time.perf_counter() - started, 2),
        "graph": {"nodes": len(nodes), "edges": len(edges)},
        "targets": {"current_accuracy": 0.95, "as_of_accuracy": 0.90},
    }
    if beyond_scored is not None:
        result["beyond_rules"] = {"relation": "play_for", "players": len(world.teams), **beyond_scored}
    if llm == "simulator":
        judgments = {name: run.stats.get(name, 0) for name in JUDGMENT_STATS}
        result["llm"] = {
            "calls": calls,
            "calls_in_status": status["llm_calls"],
            "extraction_calls": calls - judgments[JUDGMENTS],
            **judgments,
        }
    return result


MODES = {
    "offline": "offline (no LLM, hashed embeddings)",
    "simulator": "LLM simulator (extraction and fact judgments, KENNING_FACTS_LLM), hashed embeddings",
}
JUDGMENT_STATS = (JUDGMENTS, JUDGMENTS_FAILED, ENDED_BY_JUDGMENT, UNKNOWN_IDS, PAIRS_LEFT_OUT, NEW_LEFT_OUT)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--people", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--llm", choices=sorted(MODES), default="offline")
    parser.add_argument("--teams", type=int, default=0, help="people who also play for teams")
    parser.add_argument("--out", default=None, help="default: bench/results/changing_facts[_simulator].json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kenning-changing-") as home:
        result = run(args.people, args.seed, Path(home), args.llm, args.teams)
    suffix = "" if args.llm == "offline" else f"_{args.llm}"
    args.out = args.out or f"bench/results/changing_facts{suffix}.json"
    text = json.dumps(result, indent=2)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
