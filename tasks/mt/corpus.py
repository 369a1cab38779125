"""The bundled parallel corpus of mt.text.Transformer: sentences of ``tasks.lm.grammar``'s lexicon and
their translation into a made-up language, generated from seeds.

``python -m tasks.mt.corpus`` rewrites ``tasks/mt/data/stories_{train,dev}.tsv``
(``English<TAB>target`` lines) and the bundled SentencePiece model ``stories.model``
(``tasks.lm.sentencepiece_vocab.train_model``: 500 BPE pieces on both sides of the training pairs, a
sentence a line, identity normalization so the file stays small); the same seeds give the same files
byte for byte.

The target language is a word-for-word lexicon (invented words, one per English word) with its own
word order, so a model has to learn reordering as well as words: adjectives follow their noun and the
determiner closes the noun phrase (``the old miller`` -> ``miller old the``), prepositions follow
their noun phrase, the verb ends its clause after any adverb (subject, object, adverb, verb), and
conjunctions open their clause as in English. Sentences have one or two clauses.
"""

from __future__ import annotations

import os
import random
import tempfile

from tasks.lm.grammar import _WORDS as WORDS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
FILES = {"train": ("stories_train.tsv", 2000, 41), "dev": ("stories_dev.tsv", 100, 43)}
MODEL = "stories.model"
VOCAB_SIZE = 500
LEXICON_SEED = 5

Phrase = tuple[list[str], list[str]]  # (English words, target words)


def lexicon(seed: int = LEXICON_SEED) -> dict[str, str]:
    """Each English word of the grammar -> an invented word of two or three syllables (distinct)."""
    english = sorted({w for words in WORDS.values() for entry in words for w in entry.split()})
    rng = random.Random(seed)
    onsets, vowels, codas = "bdfgklmnprstvz", "aeiou", ["", "", "n", "r", "s", "l"]
    out: dict[str, str] = {}
    used = set(english)
    for word in english:
        while True:
            syllables = rng.choice([2, 2, 3]) if len(word) > 3 else rng.choice([1, 2])
            made = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(syllables))
            made += rng.choice(codas)
            if made not in used:
                break
        used.add(made)
        out[word] = made
    return out


def _words(phrase: str, lex: dict[str, str]) -> Phrase:
    english = phrase.split()
    return english, [lex[w] for w in english]


def _noun_phrase(rng: random.Random, lex: dict[str, str]) -> Phrase:
    det = rng.choice(WORDS["det"])
    adjs = rng.sample(WORDS["adj"], rng.choice([0, 0, 1, 1, 2]))
    noun = rng.choice(WORDS["noun"])
    english = [det, *adjs, noun]
    target = [lex[noun], *[lex[a] for a in reversed(adjs)], lex[det]]
    if rng.random() < 0.25:
        prep, det2, noun2 = rng.choice(WORDS["prep"]), rng.choice(["the", "a"]), rng.choice(WORDS["noun"])
        english += [prep, det2, noun2]
        target += [lex[noun2], lex[det2], lex[prep]]
    return english, target


def _clause(rng: random.Random, lex: dict[str, str]) -> Phrase:
    subject = _noun_phrase(rng, lex)
    if rng.random() < 0.35:
        verb, obj = _words(rng.choice(WORDS["iverb"]), lex), ([], [])
    else:
        verb, obj = _words(rng.choice(WORDS["verb"]), lex), _noun_phrase(rng, lex)
    adverb = _words(rng.choice(WORDS["adv"]), lex) if rng.random() < 0.4 else ([], [])
    english = subject[0] + verb[0] + obj[0] + adverb[0]
    target = subject[1] + obj[1] + adverb[1] + verb[1]
    return english, target


def pair(rng: random.Random, lex: dict[str, str]) -> tuple[str, str]:
    """One sentence pair: a clause, or two joined by a conjunction (comma, conjunction, clause)."""
    clauses = [_clause(rng, lex)]
    if rng.random() < 0.4:
        conj = _words(rng.choice(WORDS["conj"]), lex)
        second = _clause(rng, lex)
        clauses.append((conj[0] + second[0], conj[1] + second[1]))

    def text(side: int) -> str:
        joined = ", ".join(" ".join(c[side]) for c in clauses) + "."
        return joined[0].upper() + joined[1:]

    return text(0), text(1)


def write_corpus(directory: str = DATA) -> list[str]:
    """Writes the train and dev files into ``directory``; returns their paths."""
    lex = lexicon()
    paths = []
    for name, count, seed in FILES.values():
        rng = random.Random(seed)
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines("\t".join(pair(rng, lex)) + "\n" for _ in range(count))
        paths.append(path)
    return paths


def write_model(train_tsv: str, output: str, vocab_size: int = VOCAB_SIZE) -> str:
    """Trains the shared SentencePiece model on both sides of ``train_tsv`` (a sentence a line)."""
    from tasks.lm.sentencepiece_vocab import train_model

    with open(train_tsv, encoding="utf-8") as f:
        sentences = [side for line in f for side in line.rstrip("\n").split("\t")]
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "sentences.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.writelines(s + "\n" for s in sentences)
        model = train_model([text], vocab_size, model_type="bpe", normalization="identity")
    with open(output, "wb") as f:
        f.write(model)
    return output


if __name__ == "__main__":
    train, dev = write_corpus()
    written = [train, dev, write_model(train, os.path.join(DATA, MODEL))]
    for path in written:
        print(path, os.path.getsize(path), "bytes")
