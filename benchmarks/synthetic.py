"""Synthetic sentences and a BERT-base-sized WordPiece tokenizer, built offline for speed benchmarks.

Speed does not depend on weight values, only on shapes and lengths, so benchmarks use randomly
initialised models. What matters is realistic lengths in tokens: words are pseudo-words drawn from a
Zipf distribution, and a 30,522-piece WordPiece vocabulary trained on them splits rare words into
pieces as BERT's does.
"""

from __future__ import annotations

import random

SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def lexicon(size: int = 60000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    return sorted(words)


def sentences(n: int, lengths: str = "blimp", seed: int = 0) -> list[str]:
    """`blimp`: 8-25 words, uniform. `librispeech`: long-tailed, mean about 20 words, up to 100."""
    rng = random.Random(seed)
    words = lexicon()
    weights = [1 / (rank + 1) for rank in range(len(words))]
    out = []
    for _ in range(n):
        if lengths == "blimp":
            k = rng.randint(8, 25)
        else:
            k = min(100, max(1, round(rng.lognormvariate(2.85, 0.6))))
        out.append(" ".join(rng.choices(words, weights, k=k)).capitalize() + ".")
    return out


def bert_tokenizer(vocab_size: int = 30522):
    """A BertTokenizer with a WordPiece vocabulary of BERT-base's size, trained on synthetic text."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(sentences(40000, seed=1), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    return BertTokenizer(vocab=tok.get_vocab(), do_lower_case=True, model_max_length=512)
