"""The offline extractor: a deterministic knowledge graph from text, with no LLM.

It keeps ingestion working with no endpoint configured. Entities are runs of
capitalised words and years; relations link the entities of one sentence, named by
the words between them; the sentence itself is the relation's description.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from kenning.pipeline.models import Extraction, KnowledgeEdge, KnowledgeGraph, KnowledgeNode, normalize_name
from kenning.pipeline.text import paragraphs, sentences

_WORD = re.compile(r"[\w'’.-]+|[,;:()]")
_YEAR = re.compile(r"^([1-9][0-9]{2}|1[0-9]{3}|20[0-9]{2})$")
_POSSESSIVE = re.compile(r"['’]s$")
_MONTHS = {
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
}
_CONNECTORS = {"of", "de", "la", "del", "von", "van", "der", "du", "da", "&"}
_STOP = {
    "a",
    "an",
    "the",
    "he",
    "she",
    "it",
    "they",
    "we",
    "i",
    "you",
    "his",
    "her",
    "its",
    "their",
    "this",
    "that",
    "these",
    "those",
    "in",
    "on",
    "at",
    "for",
    "from",
    "by",
    "with",
    "and",
    "or",
    "but",
    "as",
    "is",
    "was",
    "were",
    "are",
    "be",
    "been",
    "to",
    "of",
    "after",
    "before",
    "when",
    "while",
    "during",
    "there",
    "here",
    "also",
    "however",
    "which",
    "who",
    "whom",
    "what",
    "where",
    "not",
    "no",
    "if",
    "then",
    "than",
    "so",
    "such",
    "both",
    "all",
    "some",
    "many",
    "most",
    "other",
    "one",
    "two",
    "first",
    "new",
    "has",
    "had",
    "have",
    "s",
    "—",
    "-",
    "since",
    "although",
    "because",
    "despite",
    "today",
    "later",
    "until",
    "once",
    "every",
    "each",
    "our",
    "my",
    "your",
    "yet",
    "thus",
    "meanwhile",
    "instead",
    "now",
    "still",
    "though",
    "unlike",
    "like",
    "few",
    "several",
    "according",
    "between",
    "under",
    "over",
    "about",
    "through",
    "among",
    "against",
    "within",
}
_ORGANIZATION = {
    "university",
    "company",
    "inc",
    "inc.",
    "corporation",
    "corp",
    "club",
    "party",
    "records",
    "band",
    "institute",
    "college",
    "school",
    "church",
    "council",
    "fc",
    "association",
    "group",
    "society",
    "ltd",
    "agency",
    "department",
    "ministry",
    "army",
    "navy",
    "league",
    "foundation",
    "committee",
}
_PREPOSITIONS = {"in", "of", "by", "at", "to", "for", "with", "from"}
_PLACE_CUES = {"in", "at", "near", "from", "to", "into", "across"}
_MAX_NAME_WORDS = 6
_MAX_EDGES_PER_SENTENCE = 6
_SUMMARY_CHARS = 240
_DESCRIPTION_CHARS = 300


class OfflineExtractor:
    """Deterministic extraction: the same text always gives the same graph."""

    model = "offline"
    prompt_version = "offline-1"

    def extract(self, text: str) -> Extraction:
        nodes: dict[str, KnowledgeNode] = {}
        edges: dict[tuple[str, str, str], KnowledgeEdge] = {}
        for sentence in _all_sentences(text):
            words = _WORD.findall(sentence)
            mentions = list(_mentions(words))
            for mention in mentions:
                key = normalize_name(mention.name)
                if key not in nodes:
                    nodes[key] = KnowledgeNode(
                        id=key,
                        name=mention.name,
                        type=mention.kind,
                        description=_clip(sentence, _DESCRIPTION_CHARS),
                    )
            for edge in _relations(sentence, words, mentions):
                edges.setdefault((edge.source, edge.relationship, edge.target), edge)
        graph = KnowledgeGraph(nodes=list(nodes.values()), edges=list(edges.values()))
        return Extraction(graph=graph, summary=summarize(text))


def summarize(text: str) -> str:
    """The leading sentences of the text, up to a few hundred characters."""
    picked: list[str] = []
    for sentence in _all_sentences(text):
        if picked and len(" ".join(picked)) + len(sentence) > _SUMMARY_CHARS:
            break
        picked.append(sentence)
    return _clip(" ".join(picked), _SUMMARY_CHARS)


def _all_sentences(text: str) -> Iterator[str]:
    for paragraph in paragraphs(text):
        yield from sentences(paragraph)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class _Mention(NamedTuple):
    name: str
    kind: str
    start: int
    end: int


def _mentions(words: list[str]) -> Iterator[_Mention]:
    """Entity mentions in order of appearance, with a guessed type."""
    position = 0
    while position < len(words):
        end, is_date = _date_end(words, position), True
        if end == position:
            end, is_date = _name_end(words, position), False
        if end == position:
            position += 1
            continue
        name = _POSSESSIVE.sub("", " ".join(words[position:end])).strip(".,;:'’")
        if name and normalize_name(name) not in _STOP:
            previous = words[position - 1].lower() if position else ""
            yield _Mention(name, "Date" if is_date else _guess_type(name, previous), position, end)
        position = end


def _date_end(words: list[str], start: int) -> int:
    """The end of a date ("11 November 875", "March 1920", "1920") at `start`, or `start`."""
    end = start + 1 if _is_day(words, start) else start
    has_month = end < len(words) and words[end].lower() in _MONTHS
    if has_month:
        end += 2 if _is_day(words, end + 1) else 1
    elif end > start:
        return start
    if end < len(words) and _YEAR.match(words[end]) and (has_month or len(words[end]) == 4):
        end += 1
    return end


def _is_day(words: list[str], position: int) -> bool:
    return position < len(words) and words[position].isdigit() and len(words[position]) <= 2


def _name_end(words: list[str], start: int) -> int:
    """The end of a name starting at `start`, or `start` when no name starts there."""
    if not _capitalised(words[start]):
        return start
    end = start + 1
    while end < len(words) and end - start < _MAX_NAME_WORDS:
        word = words[end]
        joins = word.lower() in _CONNECTORS and end + 1 < len(words) and _capitalised(words[end + 1])
        if not (_capitalised(word) or joins):
            break
        end += 1
    return end


def _capitalised(word: str) -> bool:
    return word[:1].isupper() and word.lower() not in _STOP


def _guess_type(name: str, previous: str) -> str:
    parts = name.lower().split()
    if parts[-1] in _ORGANIZATION or parts[0] in _ORGANIZATION:
        return "Organization"
    if previous in _PLACE_CUES:
        return "Place"
    if 2 <= len(parts) <= 3:
        return "Person"
    return "Concept"


def _relations(sentence: str, words: list[str], mentions: list[_Mention]) -> Iterator[KnowledgeEdge]:
    """Edges from the sentence's first entity to the others, and between neighbours."""
    unique = list({normalize_name(m.name): m for m in reversed(mentions)}.values())[::-1]
    pairs = [(unique[0], other) for other in unique[1:]] if unique else []
    pairs += [(unique[i], unique[i + 1]) for i in range(1, len(unique) - 1)]
    description = _clip(sentence, _DESCRIPTION_CHARS)
    for source, target in pairs[:_MAX_EDGES_PER_SENTENCE]:
        yield KnowledgeEdge(
            source=normalize_name(source.name),
            target=normalize_name(target.name),
            relationship=_relation_name(words, source, target),
            description=description,
        )


def _relation_name(words: list[str], source: _Mention, target: _Mention) -> str:
    """The lower-case words between the two mentions, as a snake_case name."""
    low, high = sorted((source.end, target.start))
    between = [w.lower() for w in words[low:high] if w.isalpha() and w.islower()]
    picked = [w for w in between if w not in _STOP or w in _PREPOSITIONS][:3]
    if not picked or picked[0] in _PREPOSITIONS:
        return "related_to"
    return "_".join(picked)
