"""Entity linking by name: one readable canonical form per name, and the title of a document.

An entity's id comes from its name (case-folded), so two paragraphs share an entity node
exactly when their mentions have the same canonical name. `canonical_name` removes what
varies between mentions of one thing (surrounding punctuation, a possessive, a leading
article, a common noun's plural, spacing around hyphens and apostrophes) and keeps the rest
as written, so the name stays readable.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kenning.pipeline.models import normalize_name
from kenning.pipeline.text import inflector, paragraphs, sentences

_ARTICLE = re.compile(r"^(?:the|a|an)\s+(?=\S)", re.IGNORECASE)
_POSSESSIVE = re.compile(r"(?<=\w)\s?'s$|(?<=s)'$")
_HYPHEN_SPACE = re.compile(r"(?<=\w)\s*-\s+(?=\w)|(?<=\w)\s+-\s*(?=\w)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+(?=[,;:])")
_APOSTROPHE_SPACE = re.compile(r"(?<=\w)\s+'(?=s\b)")
_EDGE_PUNCTUATION = "\"'“”‘’`,;:!?<>*_#|/\\~ "
_BRACKETS = {")": "(", "]": "[", "}": "{"}
# Wikipedia-style disambiguation: "Lloyd (film)", "Henry Moore (cricketer)".
_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)$")
_BLANK_LINE = re.compile(r"\n\s*\n")
_HEADING_MARK = re.compile(r"^#{1,6}\s+")
_UNDERLINES = re.compile(r"^([=\-~^*#+])\1{2,}\s+|\s+([=\-~^*#+])\2{2,}$")
_HEADER_FIELD = re.compile(r"^[A-Z][\w-]*: \S")
_TITLE_FIELD = re.compile(r"(?:^|\s)Title:\s+(.+?)(?=\s+[A-Z][\w-]*:\s|$)")
_SENTENCE_END = (".", "!", "?", ":", ";", ",")
# Plural demonyms and members ("Americans", "Germans", "Republicans"), not surnames ("Evans").
_PLURAL_DEMONYM = re.compile(r"^[A-Z]\w*(?:ia|ea|ca|ma)ns$")
_NOT_PLURAL = ("ss", "us", "is", "ics", "ous", "'s")
_TITLE_WORDS = 16
_TITLE_CHARS = 150


@lru_cache(maxsize=65536)
def canonical_name(name: str) -> str:
    """The readable form of a name shared by all its mentions ("the Smiths'" -> "Smith")."""
    text = " ".join(name.replace("’", "'").replace("‘", "'").split())
    text = _HYPHEN_SPACE.sub("-", _APOSTROPHE_SPACE.sub("'", text))
    text = _SPACE_BEFORE_PUNCTUATION.sub("", text)
    previous = None
    while text != previous:  # bounded: every pass that changes the text shortens it
        previous = text
        text = _strip_edges(text)
        text = _POSSESSIVE.sub("", text)
        text = _ARTICLE.sub("", text)
    return _singular_last_word(text) if text else ""


def name_key(name: str) -> str:
    """The identity of a name: its canonical form, case-folded (what an entity's id is made from)."""
    return normalize_name(canonical_name(name))


def _strip_edges(text: str) -> str:
    text = text.strip(_EDGE_PUNCTUATION)
    # A sentence's full stop sticks to its last word: "Lothair II." is "Lothair II"; "D.C." stays.
    if text.endswith(".") and "." not in text.rsplit(" ", 1)[-1][:-1]:
        text = text[:-1].rstrip()
    while text and text[0] in "([{" and text.count(text[0]) > text.count(_closing(text[0])):
        text = text[1:].lstrip()
    while text and text[-1] in _BRACKETS and text.count(text[-1]) > text.count(_BRACKETS[text[-1]]):
        text = text[:-1].rstrip()
    return text


def _closing(opening: str) -> str:
    return next(close for close, open_ in _BRACKETS.items() if open_ == opening)


def _singular_last_word(text: str) -> str:
    head, _, last = text.rpartition(" ")
    singular = _singular(last)
    return f"{head} {singular}" if head else singular


@lru_cache(maxsize=65536)
def _singular(word: str) -> str:
    """A plural common noun ("films") or demonym ("Americans") in the singular; else the word."""
    if len(word) <= 3 or not word.isalpha() or not word.endswith("s") or word.lower().endswith(_NOT_PLURAL):
        return word
    if _PLURAL_DEMONYM.match(word):
        return word[:-1]
    if not word.islower():
        return word
    singular = inflector().singular_noun(word)
    return singular if isinstance(singular, str) and singular else word


def document_title(text: str) -> str:
    """The title a text opens with, or "".

    A title is a first paragraph of one short line with no sentence end ("Lloyd (film)" then
    a blank line, as 2Wiki and HotpotQA paragraphs are ingested), a Markdown heading, a
    reStructuredText title with its underline, or the `Title:` field of a header block
    ("PEP: 8 / Title: Style Guide for Python Code / Author: ..."). Text must follow a title
    line; a header block names its title on its own.
    """
    blocks = _BLANK_LINE.split(text.strip(), maxsplit=1)
    head = " ".join(blocks[0].split())
    field = _TITLE_FIELD.search(head) if _HEADER_FIELD.match(head) else None
    if field:
        return field.group(1)
    if len(blocks) < 2 or not blocks[1].strip():
        return ""
    line = _HEADING_MARK.sub("", _UNDERLINES.sub("", head)).strip()
    if not line[:1].isupper() and not line[:1].isdigit():
        return ""
    if len(line) > _TITLE_CHARS or len(line.split()) > _TITLE_WORDS or line.endswith(_SENTENCE_END):
        return ""
    return line


def title_entity_name(title: str) -> str:
    """The entity a title names: its canonical form without a disambiguation ("Lloyd (film)" -> "Lloyd")."""
    return canonical_name(_DISAMBIGUATION.sub("", title)) or canonical_name(title)


def after_title(text: str) -> str:
    """The text after the title it opens with: "" for a header block with nothing after it."""
    return (_BLANK_LINE.split(text.strip(), maxsplit=1) + [""])[1]


def first_sentence(text: str) -> str:
    """The first sentence after a text's title ("" when it has none)."""
    body = after_title(text) if document_title(text) else text.strip()
    for paragraph in paragraphs(body):
        found = sentences(paragraph)
        if found:
            return found[0]
    return ""
