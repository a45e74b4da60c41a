"""word_sort: sort a few words alphabetically (a single-turn honing environment package).

Tasks are procedural. The split of a task is a hash of its question, so train and held-out
questions never coincide. Params (a recipe's `params:` override them):

- `min_words`, `max_words`: how many words a task has (default 3..5);
- `level`: 1 = words with distinct first letters, 2 = any words, 3 = words that share a prefix
  (`card`, `care`, `cargo`: the order is decided by a later letter).

Reward: 1 for the exact sorted list; a reply with exactly the right words in a wrong order gets
partial credit (half the fraction of words in the right place, so always < 0.5); anything else 0.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from typing import Any, Iterator

from honing.envpkg import Environment

__version__ = "0.1.0"

WORDS = (
    "apple", "banana", "cherry", "delta", "eagle", "forest", "garden", "harbor", "island", "jungle",
    "kettle", "lemon", "mango", "needle", "orange", "pepper", "quartz", "river", "silver", "tiger",
    "umbrella", "violet", "walnut", "yellow", "zebra", "anchor", "bridge", "candle", "desert", "ember",
    "falcon", "glacier", "hammer", "igloo", "jasper", "koala", "ladder", "meadow", "nutmeg", "otter",
    "pebble", "quiver", "rocket", "saddle", "tunnel", "vessel", "window", "yogurt", "zipper", "basket",
)
FAMILIES = (
    ("card", "care", "cargo", "carpet", "carrot", "cart", "carbon", "career"),
    ("star", "stare", "start", "stack", "stamp", "stand", "stable", "staff"),
    ("plan", "plane", "plank", "plant", "plate", "play", "plaza", "plastic"),
    ("tree", "trek", "trend", "trial", "trick", "trip", "tribe", "trim"),
    ("moon", "mood", "moor", "moose", "mop", "moral", "more", "moth"),
)
HELDOUT_PERCENT = 20
PROMPT = ("Sort these words into alphabetical order: {words}\n"
          "Reply with the sorted words separated by single spaces, and nothing else.")


def _pick(rng: random.Random, level: int, k: int) -> list[str]:
    if level <= 1:
        by_letter: dict[str, list[str]] = {}
        for w in WORDS:
            by_letter.setdefault(w[0], []).append(w)
        letters = rng.sample(sorted(by_letter), k)
        return [rng.choice(by_letter[c]) for c in letters]
    if level == 2:
        return rng.sample(WORDS, k)
    family = list(rng.choice(FAMILIES))
    return rng.sample(family, min(k, len(family)))


def split_of(question: str) -> str:
    h = int(hashlib.sha256(question.encode()).hexdigest(), 16)
    return "heldout" if h % 100 < HELDOUT_PERCENT else "train"


def make_tasks(split: str, seed: int, min_words: int = 3, max_words: int = 5,
               level: int = 2) -> Iterator[dict[str, Any]]:
    """Task dicts of `split`, forever, in a deterministic order for `seed`."""
    if not 2 <= min_words <= max_words <= 8:
        raise ValueError(f"need 2 <= min_words <= max_words <= 8, got {min_words}..{max_words}")
    if level not in (1, 2, 3):
        raise ValueError(f"level must be 1, 2 or 3, got {level!r}")
    rng = random.Random(f"word_sort/{seed}")
    for i in itertools.count():
        words = _pick(rng, level, rng.randint(min_words, max_words))
        answer = sorted(words)
        while words == answer:  # the question must not show the answer
            rng.shuffle(words)
        question = PROMPT.format(words=" ".join(words))
        if split_of(question) != split:
            continue
        yield {
            "id": f"word_sort/{split}/{seed}/{i}",
            "prompt": question,
            "answer": " ".join(answer),
            "difficulty": round((len(words) - 2) / 6 + (level - 1) / 4, 3),
            "tags": [f"level{level}", f"{len(words)}words"],
        }


def _words(text: str) -> list[str]:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return re.findall(r"[a-z]+", lines[-1].lower()) if lines else []


def score(completion: str, answer: str) -> float:
    """1 for the exact sorted list; partial credit for the right words in a wrong order."""
    got, want = _words(completion), answer.split()
    if got == want:
        return 1.0
    if sorted(got) != want:
        return 0.0
    return 0.5 * sum(a == b for a, b in zip(got, want)) / len(want)  # < 0.5: some word is out of place


def solve(task: Any) -> str:
    """The reference solver: the words of the question, sorted."""
    line = task.question.splitlines()[0]
    return " ".join(sorted(line.split(":", 1)[1].split()))


ENV = Environment(
    name="word_sort",
    version=__version__,
    description="Sort 3-5 words alphabetically (single-turn; levels 1-3, partial credit for the right words)",
    tasks=make_tasks,
    verifier=score,
    reference=solve,
    params={"min_words": 3, "max_words": 5, "level": 2},
    eval_suite="suite.yaml",
)
