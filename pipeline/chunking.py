"""Token-aware chunking: sentences packed into chunks, paragraph boundaries preferred; chunks
grouped into extraction units."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pydantic import BaseModel, Field, model_validator

from kenning.pipeline.text import count_tokens, paragraphs, sentences, split_words


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


def units(text: str, max_tokens: int) -> Iterator[tuple[str, int, bool]]:
    """Sentences with their token counts; the flag marks the last one of a paragraph."""
    for paragraph in paragraphs(text):
        parts = sentences(paragraph)
        for position, sentence in enumerate(parts):
            last = position == len(parts) - 1
            tokens = count_tokens(sentence)
            if tokens <= max_tokens:
                yield sentence, tokens, last
                continue
            pieces = list(split_words(sentence, max_tokens))
            for number, piece in enumerate(pieces):
                yield piece, count_tokens(piece), last and number == len(pieces) - 1


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
