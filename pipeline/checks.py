"""Checks of what a model returns, whatever the model: entity types, descriptions, fact ends,
and the shape of the replies completion steps use. Each repair or drop is counted by its caller
under one of the names below, so that a run's stats say what was changed."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# Run stats: what the load step changed in the extractions it read.
ENTITIES_FROM_FACTS = "fact_ends_repaired"
FACTS_DROPPED = "facts_dropped"
TYPES_MAPPED = "entity_types_mapped"
DESCRIPTIONS_DROPPED = "descriptions_dropped"
# Run stats: what the extract step did to get a usable reply.
REPLIES_REPAIRED = "replies_repaired"
REPLIES_SPLIT = "replies_truncated_and_split"
# A reply cut at max_tokens while it repeated itself: what it held whole kept, not asked again.
REPLIES_SALVAGED = "replies_looped_and_salvaged"
# A half's reply cut at max_tokens again: what it held whole kept, the rest of that half lost.
REPLIES_CUT_KEPT = "replies_cut_and_partly_kept"
# What getting usable replies took, counted by the extract step.
REPLY_COUNTERS = (REPLIES_REPAIRED, REPLIES_SPLIT, REPLIES_SALVAGED, REPLIES_CUT_KEPT)
CHECK_COUNTERS = (
    ENTITIES_FROM_FACTS,
    FACTS_DROPPED,
    TYPES_MAPPED,
    DESCRIPTIONS_DROPPED,
    REPLIES_REPAIRED,
    REPLIES_SPLIT,
    REPLIES_SALVAGED,
    REPLIES_CUT_KEPT,
)

DEFAULT_ENTITY_TYPES = ("Person", "Organization", "Place", "Date", "Event", "Work", "Object", "Concept")
GENERIC_TYPE = "Concept"

# Words a model uses for a type of the default set; a word maps only to a type configured.
_SYNONYM_WORDS = {
    "Person": (
        "people human character individual author writer artist actor keeper politician scientist "
        "founder member player musician"
    ),
    "Organization": (
        "organisation company corporation institution group guild team agency business firm society "
        "association club party band school university college government ministry army navy "
        "publisher newspaper"
    ),
    "Place": (
        "location city town village country region state province building landmark address area "
        "island river mountain harbor harbour port site gpe geo facility lighthouse street county "
        "continent lake sea coast"
    ),
    "Date": "time year period day month century decade datetime timestamp era",
    "Event": "incident battle war accident disaster meeting ceremony storm shipwreck rescue election",
    "Work": (
        "book film movie album song publication novel article painting artwork show series game "
        "poem play opera magazine"
    ),
    "Object": (
        "ship vessel boat vehicle product artifact artefact device tool machine equipment lamp "
        "instrument item thing"
    ),
}
_SYNONYMS = {kind: frozenset(words.split()) for kind, words in _SYNONYM_WORDS.items()}
_TOKEN = re.compile(r"[a-z0-9]+")
_WORD = re.compile(r"\w+")
# An end like `n3`, `e12` or `node_4`: a key of the model's, never a name.
_MACHINE_KEY = re.compile(r"(?:[a-z]{1,2}|node|entity|ent)[_\-]?\d+", re.IGNORECASE)
_HINTED = re.compile(r"^(?P<name>.+?)\s*\((?P<hint>[A-Za-z][A-Za-z _\-]{0,40})\)\s*$")
_LABEL = re.compile(
    r"^(?:follow[- ]?up(?: question)?|question|query|search(?: query)?)\s*:\s*", re.IGNORECASE
)
_QUESTION_WORDS = frozenset(
    "who whom whose what which when where why how is are was were do does did can could has have had "
    "will would should".split()
)


def entity_type(raw: str, allowed: Sequence[str]) -> tuple[str, bool]:
    """The configured type for a model's type name, and whether it was mapped (outside the set).
    No type stays none; a type the set lacks maps by its words, else to the generic one."""
    text = raw.strip()
    if not text:
        return "", False
    by_key = {_key(name): name for name in allowed}
    if _key(text) in by_key:
        return by_key[_key(text)], False
    words = _TOKEN.findall(text.casefold())
    for word in (_key(text), *reversed(words)):
        for target, synonyms in _SYNONYMS.items():
            if _key(target) in by_key and (word in synonyms or word == _key(target)):
                return by_key[_key(target)], True
    generic = by_key.get(_key(GENERIC_TYPE), "")
    return generic, True


def mentions(description: str, name: str) -> bool:
    """Whether a description speaks of the entity: it names it, or one word of its name."""
    said = {word.casefold() for word in _WORD.findall(description)}
    words = [word.casefold() for word in _WORD.findall(name)]
    significant = [word for word in words if len(word) >= 3 or word.isdigit()] or words
    return any(word in said for word in significant)


def fact_end(reference: str, names: Iterable[str], keys: Iterable[str] = ()) -> tuple[str, str] | None:
    """A fact end that names no listed entity, read as an entity: (name, type hint), or None when
    it is a key of the model's (`n3`, or `7` where the listed `keys` are numbers too) rather than a
    name. An end written `Name (Type)` gives its hint, a number a date's; an end in snake_case
    gives its words, written as a listed name when one matches."""
    text = " ".join(reference.split())
    numeric_keys = any(key.strip().isdigit() for key in keys)
    if not text or _MACHINE_KEY.fullmatch(text) or (text.isdigit() and numeric_keys):
        return None
    if text.isdigit():
        return text, "Date" if len(text) <= 4 else ""
    hint = ""
    hinted = _HINTED.match(text)
    if hinted:
        text, hint = hinted.group("name").strip(), hinted.group("hint").strip()
    if "_" in text and " " not in text:
        spaced = text.replace("_", " ")
        known = {_key(name): name for name in names}
        text = known.get(_key(spaced), spaced)
    return text, hint


def follow_up_question(reply: str) -> str | None:
    """The question a follow-up step replied, or None when the reply is not one question: its
    first line, without a label, must end with `?` or open with a question word, in 3+ words."""
    lines = [line.strip().strip("\"'`*-• ").strip() for line in reply.splitlines()]
    first = next((line for line in lines if line), "")
    first = _LABEL.sub("", first).strip().strip("\"'`")
    words = first.split()
    if len(words) < 3:
        return None
    if first.endswith("?") or words[0].casefold() in _QUESTION_WORDS:
        return first
    return None


def one_of(reply: str, names: Iterable[str]) -> str | None:
    """The one name of `names` a reply gives (a router's search type), or None when it gives none
    or several."""
    wanted = {name.upper() for name in names}
    found = {word for word in re.findall(r"[A-Z][A-Z_]+", reply.upper()) if word in wanted}
    return found.pop() if len(found) == 1 else None


def _key(text: str) -> str:
    return "".join(_TOKEN.findall(text.casefold()))
