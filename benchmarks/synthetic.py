"""Synthetic sentences, BERT-base and RoBERTa-base shaped models with real tokenizers, built offline.

Speed does not depend on weight values, only on shapes and lengths, so benchmarks use randomly
initialised models. What matters is realistic lengths in tokens: words are pseudo-words drawn from a
Zipf distribution, and tokenizers of the real models' sizes (WordPiece 30,522 for BERT, byte-level BPE
50,265 for RoBERTa) trained on them split rare words into pieces as the real ones do.

`model_folder` saves a shape as an ordinary model folder (safetensors, config, tokenizer files), so
every method of a benchmark, in any environment, loads the very same weights from disk.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from distributed_scoring.offline.models import build_folder

SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]

# Model shapes with the public base models' sizes: 12 layers, hidden 768, 12 heads, feed-forward 3072.
SHAPES = ("bert-base", "roberta-base")

# Wider than the default 0.02, so conditionals are far from uniform and a disagreement between methods
# shows in the numbers; it changes no shape and so no speed.
INITIALIZER_RANGE = 0.05


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
    # cumulative once: `choices(weights=...)` would re-sum 60,000 weights per sentence (same draws either way)
    cum_weights = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(words))))
    out = []
    for _ in range(n):
        if lengths == "blimp":
            k = rng.randint(8, 25)
        else:
            k = min(100, max(1, round(rng.lognormvariate(2.85, 0.6))))
        out.append(" ".join(rng.choices(words, cum_weights=cum_weights, k=k)).capitalize() + ".")
    return out


def bert_tokenizer(vocab_size: int = 30522):
    """A BertTokenizer with a WordPiece vocabulary of BERT-base's size, trained on synthetic text."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    tok.train_from_iterator(sentences(40000, seed=1), trainer)
    return BertTokenizer(vocab=tok.get_vocab(), do_lower_case=True, model_max_length=512)


def roberta_tokenizer(vocab_size: int = 50265):
    """A RobertaTokenizer with a byte-level BPE of RoBERTa-base's size, trained on synthetic text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import RobertaTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(sentences(40000, seed=1), trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return RobertaTokenizer(vocab=model["vocab"], merges=merges, model_max_length=512)


def random_model(shape: str, tokenizer, seed: int = 0):
    """A randomly initialised masked LM of the public base model's shape, in float32, eval mode."""
    import torch
    import transformers as T

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, initializer_range=INITIALIZER_RANGE)
    if shape == "bert-base":
        return T.BertForMaskedLM(T.BertConfig(**common)).eval()
    if shape == "roberta-base":
        config = T.RobertaConfig(
            **common,
            max_position_embeddings=514,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        return T.RobertaForMaskedLM(config).eval()
    raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def model_folder(shape: str, root: Path) -> Path:
    """`root/<shape>`: a saved random model of the shape with its tokenizer, built once (a minute or so)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")

    def build(folder: Path) -> None:
        tokenizer = bert_tokenizer() if shape == "bert-base" else roberta_tokenizer()
        random_model(shape, tokenizer).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return build_folder(root / shape, build, shape)


def small_bert_folder(root: Path, name: str, vocab_size: int, hidden: int, layers: int, heads: int, ffn: int) -> Path:
    """`root/<name>`: a saved random BERT smaller than base, with a WordPiece tokenizer of `vocab_size`
    trained like `bert_tokenizer`, built once."""
    import torch
    import transformers as T

    def build(folder: Path) -> None:
        tokenizer = bert_tokenizer(vocab_size)
        torch.manual_seed(0)
        config = T.BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=ffn,
            initializer_range=INITIALIZER_RANGE,
        )
        T.BertForMaskedLM(config).eval().save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return build_folder(root / name, build, name)
