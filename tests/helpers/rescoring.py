"""Test helpers for causal scoring and N-best rescoring: tiny causal LMs and N-best lists with a known
answer (English-like and antibody). The naive log P reference is `reference.NaiveCausal`.

Tiny causal LMs are built in-process with tokenizers trained on `tiny.CORPUS` (no downloads). The
families cover the four ways a tokenizer can mark sentence boundaries (see `causal` module docstring):
one shared token (GPT-2 style), distinct BOS/EOS (Llama, whose tokenizer also adds BOS by itself),
EOS only, BOS only; every architecture of `causal._PLAIN_HEADS`; and Gemma-2, whose logits are
soft-capped after the projection and so must go through the full-logits path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from distributed_scoring.io import nbest

from helpers import tiny

ENDOFTEXT = "<|endoftext|>"
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
MAX_POSITIONS = 64

# family -> (tokenizer kind, architecture)
CAUSAL_FAMILIES = {
    "gpt2": ("shared", "gpt2"),
    "llama": ("llama", "llama"),
    "qwen2": ("eos_only", "qwen2"),
    "gpt-neox": ("bos_only", "gpt-neox"),
    "opt": ("shared", "opt"),
    "mistral": ("llama", "mistral"),
    "gpt-neo": ("shared", "gpt-neo"),
    "gptj": ("shared", "gptj"),
    "gemma2": ("llama", "gemma2"),
}


def _byte_bpe(specials: list[str]):
    vocab, merges = tiny._bpe(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def make_causal_tokenizer(kind: str):
    from tokenizers import decoders
    from transformers import GPT2Tokenizer, LlamaTokenizer, PreTrainedTokenizerFast

    if kind == "shared":
        vocab, merges = tiny._bpe([ENDOFTEXT])
        return GPT2Tokenizer(vocab=vocab, merges=merges, model_max_length=MAX_POSITIONS)
    if kind == "llama":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        alphabet = sorted(set("".join(tiny.CORPUS)))
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet
        )
        tok.train_from_iterator(tiny.CORPUS, trainer)
        model = json.loads(tok.to_str())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        return LlamaTokenizer(vocab=model["vocab"], merges=merges, add_bos_token=True, model_max_length=MAX_POSITIONS)
    specials = {"eos_only": dict(eos_token=ENDOFTEXT), "bos_only": dict(bos_token="<s>")}[kind]
    tok = _byte_bpe(list(specials.values()) + ["<pad>"])
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", model_max_length=MAX_POSITIONS, **specials)


def make_causal_model(arch: str, tokenizer, seed: int = 0):
    """A randomly initialised causal LM, sized for fast CPU tests, with far-from-uniform conditionals."""
    import transformers as T

    torch.manual_seed(seed)
    ends = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    common = dict(vocab_size=len(tokenizer), initializer_range=0.2, **ends)
    llama_like = dict(**SIZES, **common, num_key_value_heads=1, max_position_embeddings=MAX_POSITIONS)
    if arch == "gpt2":
        config = T.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=MAX_POSITIONS, **common)
        return T.GPT2LMHeadModel(config).eval()
    if arch == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**llama_like)).eval()
    if arch == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(**llama_like, sliding_window=8)).eval()
    if arch == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(**llama_like)).eval()
    if arch == "gemma2":
        config = T.Gemma2Config(**llama_like, head_dim=16, final_logit_softcapping=3.0, query_pre_attn_scalar=16)
        return T.Gemma2ForCausalLM(config).eval()
    if arch == "gpt-neox":
        config = T.GPTNeoXConfig(**SIZES, **common, max_position_embeddings=MAX_POSITIONS, rotary_pct=0.5)
        return T.GPTNeoXForCausalLM(config).eval()
    if arch == "opt":
        config = T.OPTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            ffn_dim=64,
            word_embed_proj_dim=16,
            max_position_embeddings=MAX_POSITIONS,
            pad_token_id=tokenizer.pad_token_id or 0,
            **common,
        )
        return T.OPTForCausalLM(config).eval()
    if arch == "gpt-neo":
        config = T.GPTNeoConfig(
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
            max_position_embeddings=MAX_POSITIONS,
            **common,
        )
        return T.GPTNeoForCausalLM(config).eval()
    if arch == "gptj":
        config = T.GPTJConfig(n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_positions=MAX_POSITIONS, **common)
        return T.GPTJForCausalLM(config).eval()
    raise ValueError(arch)


def save_tiny_causal(family: str, folder: Path, seed: int = 0) -> Path:
    kind, arch = CAUSAL_FAMILIES[family]
    tokenizer = make_causal_tokenizer(kind)
    make_causal_model(arch, tokenizer, seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# N-best lists with a known answer.

WORDS = "the a cat dog sat ran on under mat rug quick brown fox jumps over lazy".split()


def corrupt(words: list[str], n_edits: int, rng: random.Random, vocabulary: list[str]) -> list[str]:
    """`words` with `n_edits` positions substituted by a different word of `vocabulary`."""
    out = list(words)
    for position in rng.sample(range(len(out)), min(n_edits, len(out))):
        out[position] = rng.choice([w for w in vocabulary if w != out[position]])
    return out


def synthetic_nbest(
    n_utts: int, n_best: int, seed: int, prefix: str = "utt", length: int = 6, noise: float = 1.0
) -> tuple[list[dict], dict[str, float]]:
    """Records of N-best lists where the reference is always a hypothesis but the sequence model's
    noisy score (-0.5 per wrong word + noise) often ranks a corrupted one first, and an "oracle LM"
    score per text: -10 per wrong word, so that lambda = 1 picks the reference in every utterance
    (the margin is over 7 noise standard deviations).
    """
    rng = random.Random(seed)
    records, lm = [], {}
    for u in range(n_utts):
        ref = [rng.choice(WORDS) for _ in range(length)]
        texts = {" ".join(ref): 0}
        while len(texts) < n_best:
            k = rng.randint(1, 3)
            texts.setdefault(" ".join(corrupt(ref, k, rng, WORDS)), k)
        scored = sorted(((-0.5 * k + rng.gauss(0, noise), t) for t, k in texts.items()), reverse=True)
        for rank, (score, text) in enumerate(scored, start=1):
            records.append(dict(utt_id=f"{prefix}{u}", hyp_id=rank, text=text, score=score, ref=" ".join(ref)))
            lm[text] = -10.0 * sum(a != b for a, b in zip(text.split(), ref))
    return records, lm


AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"


def antibody_nbest(
    sequences: dict[str, str],
    n_best: int = 10,
    max_substitutions: int = 4,
    noise: float = 1.0,
    seed: int = 0,
):
    """N-best lists of antibody chains for real-weight rescoring tests (e.g. AntiBERTy through Ray).

    Each sequence (name -> residues, e.g. `antibodies.v_genes("human")`) is an utterance whose
    reference is the true chain; its hypotheses are the truth and `n_best - 1` copies with 1 to
    `max_substitutions` random residue substitutions. The "sequence model" score is
    -(substitutions) + Gaussian noise, so the truth is ranked first in about half of the utterances
    (random 100-residue chains, 10-best, noise 1) and is always in the list, so an MLM
    that knows antibodies can repair the ranking. Texts are space-separated residues, as the protein
    tokenizers take them. Returns an `nbest.NBEST_SCHEMA` table.
    """
    from distributed_scoring.offline.antibodies import spaced

    rng = random.Random(seed)
    records = []
    for name, truth in sequences.items():
        hyps = {truth: 0}
        while len(hyps) < n_best:
            k = rng.randint(1, max_substitutions)
            hyps.setdefault("".join(corrupt(list(truth), k, rng, list(AMINO_ACIDS))), k)
        scored = sorted(((-k + rng.gauss(0, noise), h) for h, k in hyps.items()), reverse=True)
        for rank, (score, hyp) in enumerate(scored, start=1):
            records.append(dict(utt_id=name, hyp_id=rank, text=spaced(hyp), score=score, ref=spaced(truth)))
    return nbest.nbest_table(records, "antibody N-best lists")
