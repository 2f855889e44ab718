"""The offline extractor: a deterministic knowledge graph from text, with no LLM.

It keeps ingestion working with no endpoint configured. Entities are runs of
capitalised words and dates, under canonical names (see `linking`), so a name
mentioned in two texts is one entity. A relation joins two neighbouring mentions of
one sentence only where a verb or preposition phrase stands between them, and is
named by it; "X, also known as Y" and "X (Y)" make Y an alias of X. A text that
opens with a title is about it: a pronoun ("He directed Y") stands for the title's
entity. The sentence is the description of its relations.

A remembered message (`[time] Speaker: words`, as kenning writes one) is read as chat: its
speaker is its topic, and "I", "my" and "we" stand for the speaker. Chat opens sentences with
words that are no names ("Wow", "Yeah", "Thanks Mel", "I'm", "How"): a capitalised word that
opens a sentence is a name only when it is no interjection, pronoun, contraction or question
word, those words are cut from the front of a longer name, and a token with digits in it (a
message or dialog id) names nothing. A relation of chat reads as a fact: a verb joins its two
ends (a preposition alone, as in "Paris with Tom", does not), and a question states none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from kenning.pipeline.linking import (
    after_title,
    canonical_name,
    document_title,
    first_sentence,
    title_entity_name,
)
from kenning.pipeline.models import Extraction, KnowledgeEdge, KnowledgeGraph, KnowledgeNode, normalize_name
from kenning.pipeline.text import paragraphs, sentences

_WORD = re.compile(r"[\w\u0300-\u036f'’.-]+|[,;:()]")
_YEAR = re.compile(r"^([1-9][0-9]{2}|1[0-9]{3}|20[0-9]{2})$")
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
_CONNECTORS = {"of", "de", "la", "del", "von", "van", "der", "du", "da", "&", "the"}
_ORDINAL = re.compile(r"^[0-9]+(?:st|nd|rd|th)$")
# A sentence split after one of these ("Harold D. Schuster", "St. Maurice") was no sentence end.
_INITIAL = re.compile(r"(?:\b[A-Z]|\b(?:St|Dr|Mr|Mrs|Ms|Jr|Sr|Lt|Gen|Col|Capt|Rev|Prof|Mt|Ft|No|Co|vs))\.$")
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
_PLACE_CUES = {"in", "at", "near", "from", "to", "into", "across"}
# A relation phrase carries a verb or one of these.
_PREPOSITIONS = {
    "in", "of", "by", "at", "to", "for", "with", "from", "on", "into", "as", "about", "under", "after",
    "before", "during", "near", "against", "between", "over", "through", "within", "without", "since",
    "until", "upon", "via", "alongside", "behind", "beside", "toward", "towards", "across", "opposite",
}  # fmt: skip
_AUXILIARIES = {
    "is", "was", "were", "are", "be", "been", "being", "has", "had", "have", "became", "become",
    "becomes", "did", "does", "do", "will", "would", "can", "could", "may", "might", "shall", "should",
}  # fmt: skip
_VERBS = {
    "born", "won", "wrote", "written", "made", "led", "sang", "sung", "began", "begun", "took", "taken",
    "gave", "given", "held", "built", "known", "became", "met", "left", "ran", "run", "sold", "bought",
    "taught", "fought", "brought", "found", "lost", "grew", "drew", "drawn", "shot", "set", "kept",
    "stars", "plays", "features", "includes", "contains", "owns", "serves", "represents", "follows",
    "tells", "depicts", "marries", "directs", "produces", "writes", "leads", "hosts", "founded", "died",
}  # fmt: skip
# Dropped from relation names: they say nothing about the relation.
_FILLERS = {
    "a", "an", "the", "his", "her", "its", "their", "this", "that", "these", "those", "also", "then",
    "later", "currently", "first", "who", "which", "whom", "whose", "he", "she", "it", "they", "and",
    "or", "but", "both", "once", "still", "now", "often", "mainly", "mostly", "primarily", "best",
}  # fmt: skip
_BREAKS = {",", "and"}
_CLAUSE_OPENERS = {
    "prior", "together", "only", "back", "along", "throughout", "another", "due", "upon", "despite",
    "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve", "twenty", "following",
    "except", "apart", "aside", "outside", "inside", "whilst", "amongst", "beyond", "unlike", "per",
    "nevertheless", "having", "very", "moreover", "furthermore", "thereafter", "afterwards", "being",
}  # fmt: skip
_SUBJECT_PRONOUNS = {"he", "she", "it", "they", "his", "her", "its", "their"}
# In chat, the speaker's own words: they stand for the speaker, the message's topic.
_FIRST_PERSON = {"i", "i'm", "i've", "i'd", "i'll", "my", "me", "we", "we're", "we've", "our", "us"}
_MESSAGE = re.compile(r"^\[[0-9][0-9T:.+-]{9,40}\] (?:(?P<speaker>[^:\n\]]{1,200}): )?")
# Words chat opens a sentence with that are no names: interjections, greetings, replies, question
# words, and the everyday words a reply starts with.
_CHAT_OPENERS = {
    "yeah", "yes", "yep", "yup", "no", "nope", "nah", "wow", "whoa", "oh", "ooh", "ah", "aw", "aww",
    "hey", "hi", "hello", "bye", "goodbye", "thanks", "thank", "cheers", "okay", "ok", "sure", "well",
    "haha", "hah", "lol", "omg", "hmm", "um", "uh", "yay", "cool", "great", "nice", "awesome",
    "amazing", "congrats", "congratulations", "sorry", "please", "right", "true", "exactly",
    "totally", "absolutely", "definitely", "indeed", "wait", "look", "anyway", "good", "glad",
    "sounds", "love", "how", "why", "what", "where", "when", "who", "which", "whose", "can", "could",
    "would", "will", "do", "does", "did", "is", "are", "was", "have", "has", "had", "let", "let's",
    "just", "really", "honestly", "seriously", "maybe", "perhaps", "actually", "anyways", "btw",
    "hope", "happy", "best", "take", "keep", "enjoy", "see", "talk", "catch", "bless", "same",
    "me", "you", "your", "you're", "we", "us", "i", "i'm", "i've", "i'd", "i'll", "it's", "that's",
    "there's", "here's", "what's", "he's", "she's", "they're", "we're", "don't", "can't", "won't",
}  # fmt: skip
_ANAPHORS = {"the", "this"}
# "The film", "This album": at a sentence's start, the text's topic.
_KINDS = {
    "film", "movie", "book", "novel", "album", "song", "single", "band", "group", "company", "city",
    "town", "village", "river", "game", "series", "show", "programme", "program", "station", "building",
    "ship", "church", "school", "university", "team", "club", "party", "magazine", "newspaper", "play",
    "opera", "episode", "airport", "park", "museum", "island", "mountain", "lake", "organization",
    "organisation", "species", "genus", "plant", "bird", "family", "country", "state", "county",
    "district", "municipality", "region", "province", "language", "work", "painting", "poem", "story",
}  # fmt: skip
# "X, also known as Y", "X (born Y)", "X (Y)": Y is another name of X.
_ALIAS_CUES = (
    ("known", "as"),
    ("called",),
    ("nicknamed",),
    ("a.k.a.",),
    ("aka",),
    ("born",),
    ("née",),
    ("nee",),
    ("formerly",),
    ("born", "as"),
    ("or",),
)
_ALIAS_ADVERBS = {
    "also", "better", "commonly", "popularly", "professionally", "simply", "often", "sometimes",
    "widely", "formerly", "originally", "mononymously", "usually", "locally", "informally",
}  # fmt: skip
_COMMA_ALIAS_CUES = {("known", "as"), ("called",), ("nicknamed",), ("a.k.a.",), ("aka",)}
# Relation names the pipeline keeps for its own edges (chunk contains entity, entity is_a type).
_STRUCTURAL = {
    "contains": "includes", "is_a": "is", "is_part_of": "part_of", "made_from": "made_of",
    "is_about": "about",
}  # fmt: skip
ALIAS_RELATIONSHIP = "also_known_as"
_MAX_NAME_WORDS = 6
_MAX_GAP_WORDS = 8
_MAX_RELATION_WORDS = 4
_MAX_EDGES_PER_SENTENCE = 8
_SUMMARY_CHARS = 240
_DESCRIPTION_CHARS = 300


class OfflineExtractor:
    """Deterministic extraction: the same text always gives the same graph."""

    model = "offline"
    prompt_version = "offline-3"

    def extract(self, text: str) -> Extraction:
        message = _MESSAGE.match(text)
        if message is not None:
            return self._chat(text[message.end() :], message.group("speaker") or "")
        title = document_title(text)
        graph = _Graph(topic=_title_node(title, text) if title else None)
        for sentence in _joined_sentences(_body(text, title)):
            graph.add_sentence(sentence)
        return Extraction(graph=graph.knowledge_graph(), summary=summarize(text))

    def _chat(self, words: str, speaker: str) -> Extraction:
        """A message's graph: its names and facts, the speaker standing for "I" (see the docstring)."""
        name = canonical_name(speaker) if speaker.strip() else ""
        said = _clip(words, _DESCRIPTION_CHARS)
        key = normalize_name(name)
        topic = KnowledgeNode(id=key, name=name, type="Person", description=said) if key else None
        graph = _Graph(topic=topic, chat=True)
        for sentence in _joined_sentences(words):
            graph.add_sentence(sentence)
        return Extraction(graph=graph.knowledge_graph(), summary=summarize(words))


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


def _joined_sentences(text: str) -> Iterator[str]:
    """Sentences, rejoined where a split fell after an initial or an abbreviation."""
    for paragraph in paragraphs(text):
        pending = ""
        for sentence in sentences(paragraph):
            if pending and _opens_sentence(sentence):
                yield pending
                pending = ""
            pending = f"{pending} {sentence}" if pending else sentence
            if not _INITIAL.search(pending):
                yield pending
                pending = ""
        if pending:
            yield pending


def _opens_sentence(sentence: str) -> bool:
    """Whether the text starts like a sentence ("It was"), not like the rest of a name ("Schuster")."""
    first = sentence.split(maxsplit=1)[0]
    return first.lower() in _STOP


def _body(text: str, title: str) -> str:
    """The text after its title, if it has one."""
    return after_title(text) if title else text


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _title_node(title: str, text: str) -> KnowledgeNode:
    name = title_entity_name(title)
    return KnowledgeNode(
        id=normalize_name(name),
        name=name,
        type=_guess_type(name, ""),
        description=_clip(first_sentence(text) or title, _DESCRIPTION_CHARS),
    )


class _Mention(NamedTuple):
    name: str
    key: str
    kind: str
    start: int
    end: int
    nested: bool = False  # inside parentheses


class _Graph:
    """The nodes and edges of one text, sentence by sentence; aliases hold for the whole text."""

    def __init__(self, topic: KnowledgeNode | None, chat: bool = False) -> None:
        self.topic = topic
        self.chat = chat
        self.nodes: dict[str, KnowledgeNode] = {topic.id: topic} if topic else {}
        self.edges: dict[tuple[str, str, str], KnowledgeEdge] = {}
        self.aliases: dict[str, str] = {}
        # A surname alone stands for the full name mentioned before it: "Kuusmaa" for "Aivar Kuusmaa".
        self.short_names: dict[str, str] = {}
        if topic and topic.type == "Person":
            self._remember_short_name(topic.id)

    def knowledge_graph(self) -> KnowledgeGraph:
        return KnowledgeGraph(nodes=list(self.nodes.values()), edges=list(self.edges.values()))

    def add_sentence(self, sentence: str) -> None:
        words = _words(sentence)
        mentions = list(_mentions(words))
        if self.chat:
            mentions = [named for mention in mentions if (named := _chat_name(words, mention)) is not None]
        description = _clip(sentence, _DESCRIPTION_CHARS)
        for mention in mentions:
            full = self.short_names.get(mention.key, mention.key) if mention.kind != "Date" else mention.key
            if full != mention.key and mention.key not in self.nodes:
                self.aliases.setdefault(mention.key, full)
                continue
            self._add_node(mention, description)
            if mention.kind == "Person":
                self._remember_short_name(mention.key)
        for name, alias in _aliases(words, mentions):
            self.aliases.setdefault(alias.key, self._resolve(name.key))
            self._add_edge(name.key, ALIAS_RELATIONSHIP, alias.key, description)
        resolved = [m._replace(key=self._resolve(m.key)) for m in mentions]
        subject = self._topic_reference(words, resolved)
        found = _relations(words, resolved, subject)
        if self.chat:
            found = [] if sentence.rstrip().endswith("?") else [r for r in found if _states_fact(r[1])]
        for source, relationship, target in found[:_MAX_EDGES_PER_SENTENCE]:
            self._add_edge(source, relationship, target, description)

    def _remember_short_name(self, key: str) -> None:
        words = key.split()
        if len(words) >= 2 and words[-1].isalpha() and not _CONNECTORS.intersection(words):
            self.short_names.setdefault(words[-1], key)

    def _resolve(self, key: str) -> str:
        return self.aliases.get(key, key)

    def _add_node(self, mention: _Mention, description: str) -> None:
        if mention.key not in self.nodes:
            self.nodes[mention.key] = KnowledgeNode(
                id=mention.key, name=mention.name, type=mention.kind, description=description
            )

    def _add_edge(self, source: str, relationship: str, target: str, description: str) -> None:
        if source != target:
            edge = KnowledgeEdge(
                source=source, target=target, relationship=relationship, description=description
            )
            self.edges.setdefault((source, relationship, target), edge)

    def _topic_reference(self, words: list[str], mentions: list[_Mention]) -> _Mention | None:
        """The text's topic as a mention, where a pronoun or "The film" before any name stands for it."""
        if self.topic is None:
            return None
        first = next((m.start for m in mentions if m.kind != "Date"), len(words))
        lowered = [w.lower().replace("’", "'") for w in words[:first]]
        pronouns = _FIRST_PERSON if self.chat else _SUBJECT_PRONOUNS
        pronoun = next((i for i, w in enumerate(lowered) if w in pronouns), None)
        if pronoun is None and len(lowered) >= 2 and lowered[0] in _ANAPHORS and lowered[1] in _KINDS:
            pronoun = 1
        if pronoun is None:
            return None
        return _Mention(self.topic.name, self.topic.id, self.topic.type, pronoun, pronoun + 1)


def _chat_name(words: list[str], mention: _Mention) -> _Mention | None:
    """The mention as a name of chat: words chat opens with cut from its front when it opens the
    sentence (or follows a comma), and none when nothing is left or it holds digits (an id)."""
    if mention.kind == "Date":
        return mention
    parts = words[mention.start : mention.end]
    start = mention.start
    opens = start == 0 or words[start - 1] in {",", ":", ";", "("}
    while opens and parts and parts[0].lower().replace("’", "'") in _CHAT_OPENERS:
        parts, start = parts[1:], start + 1
    if not parts or any(ch.isdigit() for part in parts for ch in part) or _contraction(parts[0]):
        return None
    if start == mention.start:
        return mention
    name = canonical_name(" ".join(parts))
    key = normalize_name(name)
    if not key or key in _STOP:
        return None
    return mention._replace(name=name, key=key, start=start, kind=_guess_type(name, ""))


def _contraction(word: str) -> bool:
    """A word such as "I'm" or "That's": a pronoun or a determiner with its verb, no name."""
    head = word.lower().replace("’", "'").split("'", 1)
    return len(head) == 2 and (head[0] in _STOP or head[0] in _CHAT_OPENERS)


def _states_fact(relationship: str) -> bool:
    """Whether a relation name has a word besides prepositions and auxiliaries (its verb): a
    preposition alone ("with", "in") states no fact in chat."""
    return any(word not in _PREPOSITIONS | _AUXILIARIES for word in relationship.split("_"))


def _words(sentence: str) -> list[str]:
    """Words and punctuation marks; the full stop comes off the last word ("1908." is "1908")."""
    words = _WORD.findall(sentence)
    if words and words[-1].endswith(".") and "." not in words[-1][:-1]:
        words[-1] = words[-1][:-1]
    return [word for word in words if word]


def _mentions(words: list[str]) -> Iterator[_Mention]:
    """Entity mentions in order of appearance, with canonical names and a guessed type."""
    position = depth = 0
    while position < len(words):
        end, is_date = _date_end(words, position), True
        if end == position:
            end, is_date = _name_end(words, position), False
        if end == position:
            depth = max(depth + {"(": 1, ")": -1}.get(words[position], 0), 0)
            position += 1
            continue
        if position == 0 and end > 1 and not is_date and words[0].lower() in _AUXILIARIES:
            position = 1  # a question's verb: "Did John Updike..." names John Updike
        name = canonical_name(" ".join(words[position:end]))
        key = normalize_name(name)
        if key and key not in _STOP and not (position == 0 and end == 1 and _opens_clause(words)):
            previous = words[position - 1].lower() if position else ""
            kind = "Date" if is_date else _guess_type(name, previous)
            yield _Mention(name, key, kind, position, end, depth > 0)
        position = end


def _opens_clause(words: list[str]) -> bool:
    """Whether a sentence's capitalised first word is a verb, preposition or adverb opening a
    clause ("Born in", "Following the war", "Originally,"), not a name ("Irving was")."""
    first = words[0].lower()
    after = words[1].lower() if len(words) > 1 else ""
    if (len(first) > 7 and first.endswith("ly")) or first in _CLAUSE_OPENERS:
        return True
    if after == "of" and len(words) > 2 and not words[2][:1].isupper():
        return True  # "Pieces of the ship's porcelain", "Members of the band"
    if after in _AUXILIARIES or (after.isalpha() and _is_verb(after) and not after.endswith("ing")):
        return False
    return _is_verb(first) or first in _PREPOSITIONS


def _date_end(words: list[str], start: int) -> int:
    """The end of a date ("11 November 875", "March 1920", "1920") at `start`, or `start`."""
    end = start + 1 if _is_day(words, start) else start
    has_month = end < len(words) and words[end][:1].isupper() and words[end].lower() in _MONTHS
    if has_month:
        end += 2 if _is_day(words, end + 1) else 1
        if end + 1 < len(words) and words[end] == "," and _YEAR.match(words[end + 1]):
            end += 1  # "January 3, 1948"
    elif end > start:
        return start
    if end < len(words) and _YEAR.match(words[end]) and (has_month or len(words[end]) == 4):
        end += 1
    return end


def _is_day(words: list[str], position: int) -> bool:
    return position < len(words) and words[position].isdigit() and len(words[position]) <= 2


def _name_end(words: list[str], start: int) -> int:
    """The end of a name starting at `start` ("20th Century Fox" too), or `start` when none does."""
    ordinal = _ORDINAL.match(words[start]) and start + 1 < len(words) and _capitalised(words[start + 1])
    if not (_capitalised(words[start]) or ordinal):
        return start
    end = start + 1
    while end < len(words) and end - start < _MAX_NAME_WORDS:
        word = words[end]
        joins = word.lower() in _CONNECTORS and end + 1 < len(words) and _capitalised(words[end + 1])
        if not (_capitalised(word) or joins or word == "I"):  # "Charles I of England"
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


def _aliases(words: list[str], mentions: list[_Mention]) -> Iterator[tuple[_Mention, _Mention]]:
    """(name, alias) pairs set in apposition: "X, also known as Y", "X (born Y)", "X (Y)"."""
    named: _Mention | None = None
    for left, right in zip(mentions, mentions[1:], strict=False):
        if left.kind != "Date" and not left.nested:
            named = left
        if named is None or right.kind == "Date" or right.key == named.key:
            continue
        gap = _after_parentheses([w.lower() for w in words[left.end : right.start]])
        closes = right.end >= len(words) or words[right.end] in {")", ";", ","}
        if _is_alias_gap(gap, closes):
            yield named, right


def _after_parentheses(gap: list[str]) -> list[str]:
    """The gap after any closed parenthesis in it: "( 1900 - 1984 ) , also known as" -> ", also known as"."""
    closing = max((i for i, w in enumerate(gap) if w == ")"), default=-1)
    return gap[closing + 1 :]


def _is_alias_gap(gap: list[str], closes: bool) -> bool:
    words = [w for w in gap if w not in _ALIAS_ADVERBS]
    if words[:1] == ["("]:
        cue = tuple(words[1:])
        return closes and (not cue or cue in _ALIAS_CUES)
    if words[:1] == [","]:
        return tuple(words[1:]) in _COMMA_ALIAS_CUES
    return False


def _relations(
    words: list[str], mentions: list[_Mention], topic: _Mention | None
) -> list[tuple[str, str, str]]:
    """(source, relationship, target) for neighbouring mentions joined by a relation phrase.

    A date or a name used as a modifier ("a 1948 American drama film") is never a relation's
    source: the last name before it is. A phrase after a comma or "and" ("X, an American
    director, directed Y") relates the sentence's subject; a pronoun or "The film" standing for
    the text's topic makes the topic the subject.
    """
    sequence = sorted([*mentions, topic], key=lambda m: m.start) if topic else mentions
    subject = topic or next((m for m in sequence if m.kind != "Date"), None)
    found: list[tuple[str, str, str]] = []
    source: _Mention | None = None
    for left, right in zip(sequence, sequence[1:], strict=False):
        if left is topic or (left.kind != "Date" and not left.nested and not _is_modifier(words, left)):
            source = left
        phrase, after_break = _phrase(words[left.end : right.start])
        name = _relation_name(phrase)
        actor = subject if after_break else source
        if name and actor is not None and actor.key != right.key:
            found.append((actor.key, name, right.key))
    return found


def _is_modifier(words: list[str], mention: _Mention) -> bool:
    """Whether a common noun follows the mention directly, as in "American drama film"."""
    after = words[mention.end].lower() if mention.end < len(words) else ""
    if not after.isalpha() or not words[mention.end].islower():
        return False
    return not (_is_verb(after) or after in _PREPOSITIONS or after in _FILLERS)


def _phrase(gap: list[str]) -> tuple[list[str], bool]:
    """The words of a gap outside closed parentheses, from its last comma, "and" or unmatched
    parenthesis on ("( born" -> "born"), and whether it had a break before them."""
    outside: list[str] = []
    for word in gap:
        if word == ")" and "(" in outside:
            del outside[len(outside) - 1 - outside[::-1].index("(") :]
        else:
            outside.append(word)
    if ";" in outside or ":" in outside or len(outside) > _MAX_GAP_WORDS:
        return [], False
    opened = max((i for i, w in enumerate(outside) if w == "("), default=-1)
    if opened >= 0:
        return outside[opened + 1 :], False
    cut = max((i for i, w in enumerate(outside) if w in _BREAKS or w == ")"), default=-1)
    return outside[cut + 1 :], cut >= 0


def _relation_name(phrase: list[str]) -> str:
    """The phrase as a snake_case relation name, from its last content verb on; "" if it has no
    verb or preposition ("X, Y and Z" relates nothing)."""
    words = [w.lower().strip("-") for w in phrase if w.replace("-", "").isalpha()]
    words = [w for w in words if w not in _FILLERS]
    if not any(_is_verb(w) or w in _PREPOSITIONS for w in words):
        return ""
    verbs = [i for i, w in enumerate(words) if _is_verb(w) and w not in _AUXILIARIES]
    if verbs:
        words = words[verbs[-1] :]
    if len(words) > _MAX_RELATION_WORDS:  # the verb, and the words that lead to the target
        words = [words[0], *words[-2:]] if verbs else words[-_MAX_RELATION_WORDS:]
    name = "_".join(words).replace("-", "_")
    return _STRUCTURAL.get(name, name)


def _is_verb(word: str) -> bool:
    if word in _AUXILIARIES or word in _VERBS:
        return True
    return len(word) > 4 and word.isalpha() and word.endswith(("ed", "ing"))
