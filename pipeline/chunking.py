"""Token-aware chunking: sentences packed into chunks, paragraph boundaries preferred; chunks
grouped into extraction units."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from pydantic import BaseModel, Field, model_validator

from kenning.pipeline.text import count_tokens, paragraphs, sentences

# A run of letters or digits longer than this is counted as a model's tokenizer would see it, at
# about four characters a token: counted as one word, a run of megabytes would make one chunk.
LONG_RUN_CHARS = 32
CHARS_PER_TOKEN = 4
_LONG_RUN = re.compile(rf"\w{{{LONG_RUN_CHARS + 1},}}")
_TOKEN = re.compile(r"\w+|[^\w\s]")


class ChunkingConfig(BaseModel):
    size: int = Field(default=256, ge=16, description="Most tokens in one chunk")
    overlap: int = Field(default=24, ge=0, description="Tokens repeated from the previous chunk")
    unit_tokens: int = Field(
        default=2000, ge=0, description="Most chunk tokens one LLM extraction call reads; 0: one chunk a call"
    )

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingConfig:
        if self.overlap >= self.size // 2:
            raise ValueError("chunk overlap must be less than half the chunk size")
        return self


class TextPiece(BaseModel):
    text: str
    token_count: int


def chunk_tokens(text: str) -> int:
    """The tokens of a text as chunking counts them: words and punctuation marks, and a run of
    letters longer than `LONG_RUN_CHARS` one token for every `CHARS_PER_TOKEN` characters."""
    tokens = count_tokens(text)
    if len(text) > LONG_RUN_CHARS:
        tokens += sum(_run_tokens(match.group()) - 1 for match in _LONG_RUN.finditer(text))
    return tokens


def _run_tokens(token: str) -> int:
    return 1 if len(token) <= LONG_RUN_CHARS else -(-len(token) // CHARS_PER_TOKEN)


def units(text: str, max_tokens: int) -> Iterator[tuple[str, int, bool]]:
    """Sentences with their token counts; the flag marks the last one of a paragraph."""
    for paragraph in paragraphs(text):
        parts = sentences(paragraph)
        for position, sentence in enumerate(parts):
            last = position == len(parts) - 1
            tokens = chunk_tokens(sentence)
            if tokens <= max_tokens:
                yield sentence, tokens, last
                continue
            pieces = list(split_words(sentence, max_tokens))
            for number, piece in enumerate(pieces):
                yield piece, chunk_tokens(piece), last and number == len(pieces) - 1


def split_words(text: str, max_tokens: int) -> Iterator[str]:
    """Cut an over-long sentence into pieces of at most `max_tokens` tokens, between words, and
    inside a word that alone is over the limit."""
    piece: list[str] = []
    size = 0
    for word in text.split():
        for part in hard_split(word, max_tokens):
            cost = chunk_tokens(part)
            if piece and size + cost > max_tokens:
                yield " ".join(piece)
                piece, size = [], 0
            piece.append(part)
            size += cost
    if piece:
        yield " ".join(piece)


def hard_split(word: str, max_tokens: int) -> Iterator[str]:
    """A word without whitespace, whole when it is within `max_tokens`, else cut between its
    tokens, and a run of letters longer than the limit cut every `max_tokens` tokens' length."""
    if chunk_tokens(word) <= max_tokens:
        yield word
        return
    start, size = 0, 0
    for match in _TOKEN.finditer(word):
        cost = _run_tokens(match.group())
        if cost > max_tokens:
            if match.start() > start:
                yield word[start : match.start()]
            width = max_tokens * CHARS_PER_TOKEN
            yield from (match.group()[at : at + width] for at in range(0, len(match.group()), width))
            start, size = match.end(), 0
            continue
        if size + cost > max_tokens:
            yield word[start : match.start()]
            start, size = match.start(), 0
        size += cost
    if start < len(word):
        yield word[start:]


def chunk_text(text: str, config: ChunkingConfig) -> list[TextPiece]:
    """Pack sentences into chunks of at most `config.size` tokens.

    A chunk closes early at a paragraph end once it is three quarters full; the next
    chunk starts with the trailing sentences of the previous one, up to
    `config.overlap` tokens.
    """
    chunks: list[TextPiece] = []
    current: list[tuple[str, int, bool]] = []
    size = 0
    for sentence, tokens, paragraph_end in units(text, config.size - config.overlap):
        if current and size + tokens > config.size:
            chunks.append(_piece(current))
            current = _tail(current, config.overlap)
            size = sum(count for _, count, _ in current)
        current.append((sentence, tokens, paragraph_end))
        size += tokens
        if paragraph_end and size >= config.size * 3 // 4:
            chunks.append(_piece(current))
            current, size = [], 0
    if current:
        chunks.append(_piece(current))
    return chunks


def _piece(parts: list[tuple[str, int, bool]]) -> TextPiece:
    """Sentences joined by spaces, paragraphs by a blank line."""
    text = "".join(sentence + ("\n\n" if end else " ") for sentence, _, end in parts).strip()
    return TextPiece(text=text, token_count=sum(tokens for _, tokens, _ in parts))


def _tail(parts: list[tuple[str, int, bool]], overlap: int) -> list[tuple[str, int, bool]]:
    tail: list[tuple[str, int, bool]] = []
    size = 0
    for part in reversed(parts):
        if size + part[1] > overlap:
            break
        tail.insert(0, part)
        size += part[1]
    return tail


def group_units(token_counts: Sequence[int], budget: int) -> list[range]:
    """Consecutive chunks grouped into extraction units of at most `budget` tokens each.

    As few units as the budget allows, as even as they can be: the smallest cap that
    still needs no more units than `budget` does is the one used. A chunk over the
    budget is a unit of its own; a `budget` of 0 makes every chunk its own unit.
    """
    if budget <= 0:
        return [range(index, index + 1) for index in range(len(token_counts))]
    fewest = len(_pack(token_counts, budget))
    low, high = -(-sum(token_counts) // max(1, fewest)), budget
    # Fewer units never come from a smaller cap: the counts fall as the cap grows.
    for _ in range(budget.bit_length() + 1):
        if low >= high:
            break
        middle = (low + high) // 2
        if len(_pack(token_counts, middle)) <= fewest:
            high = middle
        else:
            low = middle + 1
    return _pack(token_counts, high)


def _pack(token_counts: Sequence[int], cap: int) -> list[range]:
    """Greedy packing: the fewest consecutive groups of at most `cap` tokens (or one chunk)."""
    groups: list[range] = []
    start, size = 0, 0
    for index, tokens in enumerate(token_counts):
        if index > start and size + tokens > cap:
            groups.append(range(start, index))
            start, size = index, 0
        size += tokens
    if start < len(token_counts):
        groups.append(range(start, len(token_counts)))
    return groups
