"""Tiny randomly initialised masked LMs with real tokenizers (no downloads).

Each family gets the tokenizer type it ships with (WordPiece, byte-level BPE, SentencePiece-style
Unigram), trained on a small English corpus with a small vocabulary so that many words split into
several pieces, which the `word_l2r` variant needs. Weights use a larger initialiser range than the
default so that conditionals are far from uniform and a wrong position or mask shows in the numbers.

The vocabularies were trained once and are kept in tests/data/tiny_vocabularies.json: the tokenizers
library's trainers break ties in hash order, so a vocabulary trained in each test session differed from one
session to the next ("Hi" was 2 tokens in one, 3 in another), and with it every tiny model's numbers: a test
that passed 9 fresh runs failed the 10th. `python tests/helpers/tiny.py --write` trains them again.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Masked language models score sentences by pseudo-log-likelihood.",
    "A researcher rescored the hypotheses of an automatic speech recogniser.",
    "Unbelievably, the transformers library changed its tokenizer interface again!",
    "She sells seashells by the seashore, and he buys them back.",
    "Pseudo-perplexity is computed over the whole corpus, not averaged per sentence.",
    "Distributed scoring shards corpora across actors that each hold a replica.",
    "The committee's recommendations were implemented immediately afterwards.",
    "Antibodies recognise antigens through complementarity-determining regions.",
    "Why would anyone tokenize internationalization into so many pieces?",
    "Colourless green ideas sleep furiously.",
    "It's 2026 and the cluster runs nightly audits at 03:00.",
    "Naïve café owners serve crème brûlée with jalapeño garnish.",
    "Numbers like 3.14159 and 2.71828 appear in mathematical writing.",
]

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
SPM_SPECIALS = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]

FAMILIES = ("bert", "roberta", "distilbert", "albert", "electra", "modernbert", "deberta-v2")

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
MAX_POSITIONS = 96


VOCABULARIES = Path(__file__).resolve().parents[1] / "data" / "tiny_vocabularies.json"


@functools.cache
def _vocabularies() -> dict:
    return json.loads(VOCABULARIES.read_text())


def _wordpiece() -> dict[str, int]:
    return dict(_vocabularies()["wordpiece"])


def _bpe(specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    kept = _vocabularies()["bpe"]["roberta" if specials == ROBERTA_SPECIALS else "bert"]
    return dict(kept["vocab"]), [tuple(m) for m in kept["merges"]]


def _unigram() -> list[tuple[str, float]]:
    return [tuple(piece) for piece in _vocabularies()["unigram"]]


def _train_wordpiece(vocab_size: int = 220) -> dict[str, int]:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIALS))
    return tok.get_vocab()


def _train_bpe(specials: list[str], vocab_size: int = 300) -> tuple[dict[str, int], list[tuple[str, str]]]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def _train_unigram(vocab_size: int = 200) -> list[tuple[str, float]]:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPM_SPECIALS, unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    return [tuple(piece) for piece in json.loads(tok.to_str())["model"]["vocab"]]


def make_tokenizer(family: str):
    """A real transformers tokenizer of the family's own type."""
    from transformers import (
        AlbertTokenizer,
        BertTokenizer,
        DebertaV2Tokenizer,
        DistilBertTokenizer,
        ElectraTokenizer,
        PreTrainedTokenizerFast,
        RobertaTokenizer,
    )

    if family in ("bert", "distilbert", "electra"):
        cls = {"bert": BertTokenizer, "distilbert": DistilBertTokenizer, "electra": ElectraTokenizer}[family]
        return cls(vocab=_wordpiece(), do_lower_case=True, model_max_length=MAX_POSITIONS)
    if family == "roberta":
        vocab, merges = _bpe(ROBERTA_SPECIALS)
        return RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=MAX_POSITIONS - 2)
    if family == "albert":
        return AlbertTokenizer(vocab=_unigram(), model_max_length=MAX_POSITIONS)
    if family == "deberta-v2":
        return DebertaV2Tokenizer(
            vocab=_unigram(), unk_token="<unk>", pad_token="<pad>", model_max_length=MAX_POSITIONS
        )
    if family == "modernbert":
        vocab, merges = _bpe(BERT_SPECIALS)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            cls_token="[CLS]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            unk_token="[UNK]",
            mask_token="[MASK]",
            model_max_length=MAX_POSITIONS,
        )
    raise ValueError(family)


def make_model(family: str, tokenizer, seed: int = 0):
    """A randomly initialised masked LM of the family, sized for fast CPU tests."""
    import transformers as T

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    if family == "bert":
        config = T.BertConfig(**SIZES, **common, max_position_embeddings=MAX_POSITIONS)
        model = T.BertForMaskedLM(config)
    elif family == "roberta":
        config = T.RobertaConfig(**SIZES, **common, max_position_embeddings=MAX_POSITIONS, type_vocab_size=1)
        model = T.RobertaForMaskedLM(config)
    elif family == "distilbert":
        config = T.DistilBertConfig(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            initializer_range=0.2,
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=64,
            max_position_embeddings=MAX_POSITIONS,
        )
        model = T.DistilBertForMaskedLM(config)
    elif family == "albert":
        config = T.AlbertConfig(**SIZES, **common, embedding_size=16, max_position_embeddings=MAX_POSITIONS)
        model = T.AlbertForMaskedLM(config)
    elif family == "electra":
        config = T.ElectraConfig(**SIZES, **common, embedding_size=16, max_position_embeddings=MAX_POSITIONS)
        model = T.ElectraForMaskedLM(config)
    elif family == "modernbert":
        config = T.ModernBertConfig(
            **SIZES,
            **common,
            max_position_embeddings=MAX_POSITIONS,
            global_attn_every_n_layers=2,
            local_attention=8,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
        model = T.ModernBertForMaskedLM(config)
    elif family == "deberta-v2":
        config = T.DebertaV2Config(
            **SIZES,
            **common,
            max_position_embeddings=MAX_POSITIONS,
            relative_attention=True,
            position_buckets=16,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
        )
        model = T.DebertaV2ForMaskedLM(config)
    else:
        raise ValueError(family)
    return model.eval()


def save_tiny(family: str, folder: Path, seed: int = 0) -> Path:
    """Write a loadable model folder (safetensors + tokenizer files) and return it."""
    tokenizer = make_tokenizer(family)
    model = make_model(family, tokenizer, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# --- protein masked LMs: one token per residue ------------------------------------------------------------

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"  # the 20 standard residues, in the order of the variant tables' columns
RARE_RESIDUES = "XBZUO"  # unknown, ambiguous (B = D/N, Z = E/Q) and the two rare amino acids
# ESM-2's alphabet in its own order (the facebook/esm2_* vocab.txt): specials, residues by frequency, gap tokens.
ESM_VOCABULARY = ["<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO", ".", "-", "<null_1>", "<mask>"]
PROTEIN_FAMILIES = ("bert", "esm")


def make_protein_tokenizer(family: str):
    """A fast tokenizer with one token per residue (a WordLevel model: no merges, no pieces).

    `bert` (as ProtBert): BERT's specials and residues separated by spaces ("M K T"; "MKT" is one unknown
    word). `esm` (as ESM-2): ESM's vocabulary and specials (<cls> ... <eos>), and every character its own
    word, so "MKT" and "M K T" give the same tokens, as transformers' `EsmTokenizer` does (a Python tokenizer,
    which `load_tokenizer` converts to this: tests/engine/test_esm_tokenizer.py).
    """
    from tokenizers import Regex
    from transformers import PreTrainedTokenizerFast

    if family == "bert":
        vocab = {token: i for i, token in enumerate(BERT_SPECIALS + list(AMINO_ACIDS + RARE_RESIDUES))}
        cls, sep, pad, unk, mask = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"
        pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    elif family == "esm":
        vocab = {token: i for i, token in enumerate(ESM_VOCABULARY)}
        cls, sep, pad, unk, mask = "<cls>", "<eos>", "<pad>", "<unk>", "<mask>"
        pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), behavior="isolated")]
        )
    else:
        raise ValueError(family)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece()  # joins tokens with spaces
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])]
    )
    kwargs = dict(cls_token=cls, pad_token=pad, unk_token=unk, mask_token=mask, model_max_length=MAX_POSITIONS)
    if family == "esm":
        kwargs.update(eos_token=sep)  # ESM has no [SEP]: the sequence ends with <eos>
    else:
        kwargs.update(sep_token=sep)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def make_protein_model(family: str, tokenizer, seed: int = 0):
    """A randomly initialised protein masked LM: BertForMaskedLM, or EsmForMaskedLM as ESM-2 builds it
    (rotary positions, token dropout: the embeddings scaled by the share of masked tokens in each sequence)."""
    import transformers as T

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    if family == "bert":
        model = T.BertForMaskedLM(T.BertConfig(**SIZES, **common, max_position_embeddings=MAX_POSITIONS))
    elif family == "esm":
        config = T.EsmConfig(
            **SIZES,
            **common,
            mask_token_id=tokenizer.mask_token_id,
            max_position_embeddings=MAX_POSITIONS,
            position_embedding_type="rotary",
            token_dropout=True,
            emb_layer_norm_before=False,
        )
        model = T.EsmForMaskedLM(config)
    else:
        raise ValueError(family)
    return model.eval()


def save_tiny_protein(folder: Path, family: str = "bert", seed: int = 0) -> Path:
    """Write a loadable protein model folder (safetensors + tokenizer files), one token per residue, and return it."""
    tokenizer = make_protein_tokenizer(family)
    model = make_protein_model(family, tokenizer, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_vocabularies() -> None:
    """Train the vocabularies again and keep them (review the diff: every tiny model's numbers change)."""
    bpe = {name: _train_bpe(specials) for name, specials in (("roberta", ROBERTA_SPECIALS), ("bert", BERT_SPECIALS))}
    kept = {
        "wordpiece": _train_wordpiece(),
        "bpe": {name: {"vocab": vocab, "merges": [list(m) for m in merges]} for name, (vocab, merges) in bpe.items()},
        "unigram": [list(piece) for piece in _train_unigram()],
    }
    VOCABULARIES.write_text(json.dumps(kept, ensure_ascii=False, sort_keys=True, indent=0) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write_vocabularies()
