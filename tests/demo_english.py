"""What "writes English" means for the demo models: the words of their training corpus, with the function
words real sentences are full of. Shared by the model checks and the demo fleet test."""

from __future__ import annotations

import functools
import re
from pathlib import Path

CORPUS_WORDS_FILE = Path(__file__).parent / "unit" / "demo_corpus_words.txt"
# Common English words that carry no topic: text made of real sentences is full of them.
FUNCTION_WORDS = frozenset("the a an is are of to in and or be for it that as".split())


@functools.cache
def corpus_words() -> frozenset[str]:
    return frozenset(CORPUS_WORDS_FILE.read_text().split())


def words_of(text: str) -> list[str]:
    """The lower-case words of ``text``, punctuation and digits dropped."""
    return re.findall(r"[a-z]+", text.lower())


def corpus_share(words: list[str]) -> float:
    """The share of ``words`` (not empty) that the demo corpus contains."""
    return sum(w in corpus_words() for w in words) / len(words)
