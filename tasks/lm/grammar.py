"""The bundled corpus of lm.text.* and mt.text.*: English-like sentences from a small seeded grammar.

``python -m tasks.lm.grammar`` rewrites ``tasks/lm/data/stories_{train,dev}.txt``; the same seed gives
the same files byte for byte, so the committed files and the bundled SentencePiece model
(``stories.model``, trained by ``tools.vocab`` on the training file) can always be rebuilt. Sentences run
from three words to a few dozen (clauses joined by conjunctions), so the token-length histogram has
the long tail that makes packing worth having.
"""

from __future__ import annotations

import os
import random

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
FILES = {"train": ("stories_train.txt", 3000, 17), "dev": ("stories_dev.txt", 300, 29)}

_WORDS = {
    "det": ["the", "a", "every", "one", "that", "this", "some"],
    "adj": [
        "small",
        "old",
        "quiet",
        "bright",
        "tired",
        "clever",
        "brave",
        "grey",
        "young",
        "gentle",
        "strange",
        "patient",
        "hungry",
        "careful",
        "distant",
        "golden",
        "silver",
        "narrow",
        "wooden",
    ],
    "noun": [
        "miller",
        "river",
        "lantern",
        "fox",
        "teacher",
        "garden",
        "sailor",
        "village",
        "bridge",
        "baker",
        "mountain",
        "letter",
        "horse",
        "window",
        "forest",
        "shepherd",
        "market",
        "clock",
        "island",
        "traveller",
        "kettle",
        "orchard",
        "weaver",
        "harbour",
        "painter",
        "meadow",
        "tower",
        "raven",
    ],
    "verb": [
        "watched",
        "followed",
        "carried",
        "found",
        "painted",
        "remembered",
        "crossed",
        "opened",
        "heard",
        "visited",
        "mended",
        "counted",
        "greeted",
        "lost",
        "described",
        "guarded",
        "measured",
        "praised",
    ],
    "iverb": ["slept", "waited", "laughed", "sang", "wandered", "listened", "rested", "vanished", "returned"],
    "adv": ["slowly", "quietly", "again", "at dawn", "before supper", "in the rain", "all night", "happily"],
    "prep": ["near", "behind", "beyond", "under", "beside", "across", "towards", "inside"],
    "conj": ["and", "but", "while", "because", "so", "although", "until"],
}


def _noun_phrase(rng: random.Random) -> str:
    words = [rng.choice(_WORDS["det"])]
    words += rng.sample(_WORDS["adj"], rng.choice([0, 0, 1, 1, 2]))
    words.append(rng.choice(_WORDS["noun"]))
    if rng.random() < 0.25:
        words += [rng.choice(_WORDS["prep"]), rng.choice(["the", "a"]), rng.choice(_WORDS["noun"])]
    return " ".join(words)


def _clause(rng: random.Random) -> str:
    if rng.random() < 0.35:
        words = [_noun_phrase(rng), rng.choice(_WORDS["iverb"])]
    else:
        words = [_noun_phrase(rng), rng.choice(_WORDS["verb"]), _noun_phrase(rng)]
    if rng.random() < 0.4:
        words.append(rng.choice(_WORDS["adv"]))
    return " ".join(words)


def sentence(rng: random.Random) -> str:
    """One sentence: one clause, or several joined by conjunctions (a geometric number of them)."""
    clauses = [_clause(rng)]
    while rng.random() < 0.45 and len(clauses) < 6:
        clauses.append(rng.choice(_WORDS["conj"]) + " " + _clause(rng))
    text = ", ".join(clauses) + "."
    return text[0].upper() + text[1:]


def write_corpus(directory: str = DATA) -> list[str]:
    """Writes the train and dev files into ``directory``; returns their paths."""
    paths = []
    for name, count, seed in FILES.values():
        rng = random.Random(seed)
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(sentence(rng) + "\n" for _ in range(count))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_corpus():
        print(written, os.path.getsize(written), "bytes")
