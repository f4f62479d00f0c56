"""The naive references the package is checked against, all in one module, written independently of it.

Each reference computes its figures the slow, obvious way: one forward pass per masked copy or per
value, no batching, no padding, full logits, float64 model and log-softmax; plain Python loops over
whole tables held in memory. Which tokens are scored and which are masked is derived here from the
tokenizer, never from the package's own prepare/masking code. What is taken from the package is only
column names and labels (`schema`, the audit's partition names), never a computation.

Masked LM (`tests/engine/test_pll.py`, `gpu/test_cuda.py`, `offline/test_real_weights.py`):
  `NaiveScorer`: per-token log q(w_t | W with the positions M(t) masked), i.e. the PLL's terms.
Causal LM (`tests/engine/test_causal.py`):
  `NaiveCausal`: per-token log P(w_t | w_<t) of a sentence wrapped in its boundary tokens.
Pairwise conditionals (`tests/engine/test_conditionals.py`):
  `NaivePairs`: the raw logits at a and b for every value of the other, and both-masked.
  `candidate_set`: the top-k candidate support of one position from those full tables.
Pairwise joints (`tests/engine/test_joints.py`; Torroba-Hennigen & Kim, 2023):
  `kl`, `joint_metrics`: the sec. 3 metrics written out from their definitions.
  `eq4_objective`, `minimise_eq4`: eq. 4 and a brute-force minimiser of it, for Arnold-Gokhale.
PPPL audit (`tests/workflows/audit/test_audit.py`):
  `audit_figures`: per-partition sums, histogram and positionwise curves over the rows in memory.
  `audit_outliers`: the robust-z outlier rule over a dict of sentences.
N-best rescoring (`tests/workflows/rescore/test_rescoring.py`):
  `rescore_brute_force`, `corpus_metric`: every (lambda, gamma) scored by its own loop, WER/BLEU by
  jiwer/sacrebleu.
Infilling (`tests/engine/test_infill.py`, `workflows/test_infill_command.py`, `offline/test_infill_antiberty.py`):
  `NaiveInfill`: every fill of the allowed tokens with its chain and HCB scores along its fill order.
MLM energies and Metropolis-Hastings (`tests/engine/test_sampler.py`; Goyal et al., 2022):
  `NaiveEnergy`: E_raw, E_norm, the shaped block proposal, the MH log-acceptance, the exact target
  p(X) ∝ exp(-E(X) / T) over every fill, and the stationary distribution of sweep-order Gibbs.
  `total_variation`: TV between two distributions given as dicts.
Any-order chain rule (`tests/engine/test_chain.py`, `engine/test_generate.py`; Liao et al., 2020):
  `NaiveChain`: the chain's terms along an order, one masked copy per step, and greedy Algorithm 1.
Training objectives (`tests/engine/test_training.py`; Liao et al., 2020; Salazar et al., 2020, sec. 2.2):
  `upmlm_loss`: the u-PMLM loss of a batch given its masked positions, one sequence per forward.
  `maskless_prediction`: a `sentence` student's PLL of one sentence, one unpadded forward in float64.
  `distillation_loss`: a `token`/`distribution` student's loss, token by token from its definition.
Maskless scoring (`tests/engine/test_maskless.py`; Salazar et al., 2020, Table 6):
  `unmasked_logprobs`: log q(w_t | W) of the unmasked sentence, one forward, float64.
Protein variant effects (`tests/engine/test_variants.py`; Meier et al., 2021):
  `NaiveVariants`: each variant's wild-type, masked and mutant marginals and PLL(M) - PLL(W), site by site.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from distributed_scoring.io import schema as S
from distributed_scoring.workflows.audit.figures import NO_PARTITION
from distributed_scoring.workflows.audit.verdicts import OVERALL

# --- masked LM: pseudo-log-likelihood ----------------------------------------------------------------


def scored_positions(tokenizer, ids: list[int]) -> list[int]:
    """Every position except the sequence-level specials ([CLS]/[SEP], <s>/</s>, padding)."""
    specials = {
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    } - {None}
    return [i for i, t in enumerate(ids) if t not in specials]


def masked_positions(word_ids: list, target: int, variant: str) -> list[int]:
    """M(t), the positions masked to score position `target`: `original`, t alone; `word_l2r`, t and
    the later pieces of t's word (tokens with the same word id to its right)."""
    if variant == "original" or word_ids[target] is None:
        return [target]
    return [target] + [u for u in range(target + 1, len(word_ids)) if word_ids[u] == word_ids[target]]


class NaiveScorer:
    """PLL terms: for each scored position t, log q(w_t | W with M(t) masked), one masked copy per
    forward pass, full logits, log-softmax over the whole vocabulary in float64.

    The sentence's PLL is the sum of the returned array. Holds a copy of the model in `dtype`
    (float64 by default; float32 gives the naive method's own float32 error); the log-softmax is
    always float64.
    """

    def __init__(self, model, tokenizer, dtype: torch.dtype = torch.float64) -> None:
        self.model = copy.deepcopy(model).to(dtype).eval()
        self.tokenizer = tokenizer

    def token_logprobs(self, text: str, variant: str = "original") -> np.ndarray:
        ids = self.tokenizer(text)["input_ids"]
        conditionals = self.conditionals(text, variant)
        return np.array([row[ids[t]] for t, row in zip(scored_positions(self.tokenizer, ids), conditionals)])

    @torch.no_grad()
    def conditionals(self, text: str, variant: str = "original") -> np.ndarray:
        """(n, V) the whole conditional log q(. | W with M(t) masked) at each scored position t."""
        encoding = self.tokenizer(text)
        ids = encoding["input_ids"]
        word_ids = encoding.word_ids()
        out = []
        for t in scored_positions(self.tokenizer, ids):
            copy_ids = list(ids)
            for u in masked_positions(word_ids, t, variant):
                copy_ids[u] = self.tokenizer.mask_token_id
            logits = self.model(input_ids=torch.tensor([copy_ids])).logits[0, t].double()  # (V,)
            out.append(torch.log_softmax(logits, dim=-1).numpy())
        return np.array(out)


# --- causal LM: log P --------------------------------------------------------------------------------


class NaiveCausal:
    """log P reference: one sentence per forward pass, no padding, full logits, float64 throughout.

    The sentence is wrapped as [start] + tokens + [end]: start is BOS, or EOS where the tokenizer has no
    BOS; end is EOS, or nothing where it has none. `token_logprobs` returns log P(x_t | x_<t) for every
    t after the start token, so its sum is log P(W) = sum_t log P(w_t | BOS, w_<t) + log P(EOS | BOS, W).
    The wrapping tokens are read from the tokenizer here, independently of `causal.boundary_ids`.
    """

    def __init__(self, model, tokenizer) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.tokenizer = tokenizer

    def ids(self, text: str) -> list[int]:
        t = self.tokenizer
        start = t.bos_token_id if t.bos_token_id is not None else t.eos_token_id
        end = [] if t.eos_token_id is None else [t.eos_token_id]
        return [start] + t(text, add_special_tokens=False)["input_ids"] + end

    @torch.no_grad()
    def token_logprobs(self, text: str) -> np.ndarray:
        ids = self.ids(text)
        logits = self.model(input_ids=torch.tensor([ids])).logits[0].double()  # (L, V)
        logprobs = torch.log_softmax(logits, dim=-1)
        return np.array([logprobs[t - 1, ids[t]].item() for t in range(1, len(ids))])


# --- pairwise conditionals ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NaiveTables:
    """float64, indexed by token id: [i, j] is a = i, b = j."""

    logits_a: torch.Tensor  # (V, V) raw logits at a (over i) with b = j put in
    logits_b: torch.Tensor  # (V, V) raw logits at b (over j) with a = i put in
    marginal_a: torch.Tensor  # (V,) raw logits at a, both masked
    marginal_b: torch.Tensor  # (V,) raw logits at b, both masked
    gold: tuple[int, int]


class NaivePairs:
    """The pairwise conditionals' raw logits: one forward pass per value v, full logits, float64 model.

    For the a-th and b-th scored tokens (`scored_positions`) of a sentence, with both masked and then
    one of them set to each v in V: logits_a[:, v] at a with b = v, logits_b[v, :] at b with a = v, and
    the both-masked logits at each. Their log-softmax over the scored position's axis gives
    q(a | b = v, rest), q(b | a = v, rest) and the marginals q(a | rest), q(b | rest), all in float64.
    """

    def __init__(self, model, tokenizer) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.tokenizer = tokenizer

    def positions(self, text: str, a: int, b: int) -> tuple[list[int], int, int]:
        ids = self.tokenizer(text)["input_ids"]
        scored = scored_positions(self.tokenizer, ids)
        return ids, scored[a], scored[b]

    @torch.no_grad()
    def logits_at(self, ids: list[int], position: int) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids])).logits[0, position].double()  # (V,)

    def tables(self, text: str, a: int, b: int) -> NaiveTables:
        ids, pa, pb = self.positions(text, a, b)
        mask = self.tokenizer.mask_token_id
        vocab = self.model.config.vocab_size
        both = list(ids)
        both[pa] = both[pb] = mask

        def put(position: int, value: int) -> list[int]:
            copy_ids = list(both)
            copy_ids[position] = value
            return copy_ids

        logits_a = torch.stack([self.logits_at(put(pb, v), pa) for v in range(vocab)], dim=1)  # (V_a, V_b)
        logits_b = torch.stack([self.logits_at(put(pa, v), pb) for v in range(vocab)], dim=0)  # (V_a, V_b)
        return NaiveTables(logits_a, logits_b, self.logits_at(both, pa), self.logits_at(both, pb), (ids[pa], ids[pb]))


def candidate_set(logits_given_gold: torch.Tensor, marginal: torch.Tensor, gold: int, k: int) -> np.ndarray:
    """The top-k support of one position, from full tables: {gold} | top-k of the logits with the other
    position set to its gold token | top-k of the both-masked logits, as sorted token ids."""
    top = torch.cat([logits_given_gold.topk(k).indices, marginal.topk(k).indices])
    return np.unique(np.concatenate([[gold], top.numpy()]))


# --- pairwise joints: sec. 3 metrics and eq. 4 -------------------------------------------------------


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> float:
    """KL(p || q) = sum_x p(x) (log p(x) - log q(x)), from log-probabilities (float64 in the tests)."""
    return float((log_p.exp() * (log_p - log_q)).sum())


def joint_metrics(cond, log_joint: torch.Tensor, own_unary: bool) -> list[float]:
    """Sec. 3 written out: the joint's conditionals materialised, D summed over v one value at a time.

    With p the joint and q the MLM's conditionals (`cond`, a `PairConditionals`), gold (i*, j*):
    D(v) = KL(q(a | b = v) || p(a | b = v)), D_r(v) = KL(q(b | a = v) || p(b | a = v)). Returns
    [log p(i*, j*), log u(a = i* | b = j*), log u(b = j* | a = i*), A-KL, G-KL] where u is q itself
    (`own_unary`, the MLM construction) or the joint's conditionals, A-KL = (sum D + sum D_r) / 2|V|
    and G-KL = (D(j*) + D_r(i*)) / 2.
    """
    ga, gb = cond.gold
    joint_a_given_b = log_joint - log_joint.logsumexp(0, keepdim=True)
    joint_b_given_a = log_joint - log_joint.logsumexp(1, keepdim=True)
    d = [kl(cond.log_a_given_b[:, v], joint_a_given_b[:, v]) for v in range(log_joint.shape[1])]
    d_r = [kl(cond.log_b_given_a[v, :], joint_b_given_a[v, :]) for v in range(log_joint.shape[0])]
    source_a, source_b = (cond.log_a_given_b, cond.log_b_given_a) if own_unary else (joint_a_given_b, joint_b_given_a)
    return [
        float(log_joint[ga, gb]),
        float(source_a[ga, gb]),
        float(source_b[ga, gb]),
        (sum(d) + sum(d_r)) / (2 * len(d)),
        (d[gb] + d_r[ga]) / 2,
    ]


def eq4_objective(log_joint: torch.Tensor, log_a_given_b: torch.Tensor, log_b_given_a: torch.Tensor) -> torch.Tensor:
    """Eq. 4: sum over both positions and every value of the other of KL(q || mu's conditional).

    sum_j KL(q(a | b = j) || mu(a | b = j)) + sum_i KL(q(b | a = i) || mu(b | a = i)), as a tensor (so
    that it can be differentiated) in the inputs' dtype (float64 in the tests).
    """
    mu_a = log_joint - log_joint.logsumexp(0, keepdim=True)
    mu_b = log_joint - log_joint.logsumexp(1, keepdim=True)
    kl_a = (log_a_given_b.exp() * (log_a_given_b - mu_a)).sum()
    kl_b = (log_b_given_a.exp() * (log_b_given_a - mu_b)).sum()
    return kl_a + kl_b


def minimise_eq4(log_a_given_b: torch.Tensor, log_b_given_a: torch.Tensor, starts: int = 8) -> torch.Tensor:
    """Brute force: L-BFGS on softmax-parametrised joints from several random starts; the best log-joint.

    mu = softmax(theta) over all (i, j), theta float64 drawn from a fixed seed; returns the log mu of
    the start with the lowest `eq4_objective`.
    """
    generator = torch.Generator().manual_seed(0)
    best, best_value = None, float("inf")
    for _ in range(starts):
        theta = torch.randn(log_a_given_b.shape, dtype=torch.float64, generator=generator).requires_grad_()
        optimiser = torch.optim.LBFGS(
            [theta], max_iter=2000, tolerance_grad=1e-14, tolerance_change=1e-16, line_search_fn="strong_wolfe"
        )

        def closure(theta=theta, optimiser=optimiser):  # called by this start's optimiser.step only
            optimiser.zero_grad()
            value = eq4_objective(theta.flatten().log_softmax(0).view_as(theta), log_a_given_b, log_b_given_a)
            value.backward()
            return value

        optimiser.step(closure)
        with torch.no_grad():
            log_joint = theta.flatten().log_softmax(0).view_as(theta)
            value = eq4_objective(log_joint, log_a_given_b, log_b_given_a).item()
        if value < best_value:
            best, best_value = log_joint, value
    return best


# --- PPPL audit --------------------------------------------------------------------------------------


def audit_figures(table, config) -> dict:
    """The audit's figures over a scored-rows table held in memory, in plain Python loops (float64).

    Per partition (null: NO_PARTITION) and OVERALL, `sums`: rows, errors, ok, sum_pll, n_tokens, n_words
    over ok rows (so PPPL = exp(-sum_pll / n_tokens)); `hist`: counts of each ok row's token PPPL
    exp(-pll / n_tokens) over `config.histogram`'s log-spaced edges low * (high / low) ** (i / bins),
    underflow first and overflow last. Over ok rows with tokens: `nll` id -> -pll / n_tokens;
    `by_position`[t], `tokens_at`[t]: summed -log q and count of the t-th token (t <= max_position);
    `by_length`[n][t], `sentences`[n]: the same per sentence length n <= max_length, and the count of
    sentences of each length.
    """
    rows = table.to_pylist()
    bins = config.histogram
    edges = [bins.low * (bins.high / bins.low) ** (i / bins.bins) for i in range(bins.bins + 1)]
    sums = defaultdict(lambda: defaultdict(float))
    hist = defaultdict(lambda: [0] * (bins.bins + 2))
    by_position, tokens_at = defaultdict(float), defaultdict(int)
    by_length, sentences = defaultdict(lambda: defaultdict(float)), defaultdict(int)
    nll_of = {}
    for row in rows:
        for name in (row[S.PARTITION] if row[S.PARTITION] is not None else NO_PARTITION, OVERALL):
            figures = sums[name]
            figures["rows"] += 1
            if row[S.STATUS] != "ok":
                figures["errors"] += 1
                continue
            figures["ok"] += 1
            figures["sum_pll"] += row[S.PLL]
            figures["n_tokens"] += row[S.N_TOKENS]
            figures["n_words"] += row[S.N_WORDS]
            if row[S.N_TOKENS]:
                hist[name][bisect.bisect_right(edges, math.exp(-row[S.PLL] / row[S.N_TOKENS]))] += 1
        if row[S.STATUS] != "ok" or not row[S.N_TOKENS]:
            continue
        nll_of[row[S.ID]] = -row[S.PLL] / row[S.N_TOKENS]
        length = len(row[S.TOKEN_LOGPROBS])
        sentences[length] += 1
        for t, logprob in enumerate(row[S.TOKEN_LOGPROBS], 1):
            if t <= config.max_position:
                by_position[t] -= logprob
                tokens_at[t] += 1
            if length <= config.max_length:
                by_length[length][t] -= logprob
    return {
        "sums": sums,
        "hist": hist,
        "by_position": by_position,
        "tokens_at": tokens_at,
        "by_length": by_length,
        "sentences": sentences,
        "nll": nll_of,
    }


def audit_outliers(nll: dict[str, float], k: float) -> dict[str, float]:
    """id -> robust z of the sentences beyond median + k * 1.4826 * MAD.

    z = (x - median) / (1.4826 * median |x - median|) over the given NLLs per token; kept where z > k.
    """
    median = statistics.median(nll.values())
    sigma = 1.4826 * statistics.median(abs(x - median) for x in nll.values())
    z = {i: (x - median) / sigma for i, x in nll.items()}
    return {i: v for i, v in z.items() if v > k}


# --- N-best rescoring --------------------------------------------------------------------------------


def rescore_brute_force(records, mlm, causal, options, lam: float, gamma: float) -> tuple[list[str], list[str]]:
    """(references, chosen texts) in utterance order, written without the package's arrays.

    Each hypothesis's total is score / lp(|W|, seq_alpha) + lam * (gamma * PLL / lp(n_mlm, mlm_alpha)
    + (1 - gamma) * log P / lp(n_causal, causal_alpha)), with lp(n, alpha) = ((5 + n) / 6) ** alpha and
    |W| in whitespace words; a missing LM (None) adds nothing. The first hypothesis in hyp_id order with
    the highest total is chosen (later ties lose). `mlm` and `causal` map text -> `TextScore`.
    """

    def lp(n, alpha):
        return ((5 + n) / 6) ** alpha

    by_utt: dict[str, list[dict]] = {}
    for r in records:
        by_utt.setdefault(r["utt_id"], []).append(r)
    refs, chosen = [], []
    for hyps in by_utt.values():
        best = None
        for h in sorted(hyps, key=lambda r: r["hyp_id"]):
            total = h["score"] / lp(len(h["text"].split()), options.seq_alpha)
            g = 0.0
            if mlm is not None:
                m = mlm[h["text"]]
                g += gamma * (m.logprob / lp(m.n_tokens, options.mlm_alpha))
            if causal is not None:
                c = causal[h["text"]]
                g += (1 - gamma) * (c.logprob / lp(c.n_tokens, options.causal_alpha))
            total += lam * g
            if best is None or total > best[0]:
                best = (total, h["text"])
        refs.append(hyps[0]["ref"])
        chosen.append(best[1])
    return refs, chosen


def corpus_metric(options, refs: list[str], hyps: list[str]) -> float:
    """Corpus WER (jiwer.wer) or corpus BLEU (sacrebleu.corpus_bleu, `options.bleu_tokenize`)."""
    import jiwer
    import sacrebleu

    if options.metric == "wer":
        return jiwer.wer(refs, hyps)
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize=options.bleu_tokenize).score


# --- infilling: every fill enumerated -----------------------------------------------------------------


class NaiveInfill:
    """Brute-force infilling: every fill of the allowed tokens, each scored along its order with one
    sequence per forward pass, full logits, float64 model and log-softmax (Calef et al.'s chain and HCB
    scores; see distributed_scoring/engine/infill.py for the definitions)."""

    def __init__(self, model, mask_id: int) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.mask_id = mask_id
        self.forwards = 0

    @torch.no_grad()
    def logp(self, ids: tuple[int, ...]) -> np.ndarray:
        """(L, V) log p of every position of this context."""
        self.forwards += 1
        logits = self.model(input_ids=torch.tensor([list(ids)])).logits[0].double()
        return torch.log_softmax(logits, dim=-1).numpy()

    def fills(
        self, ids: list[int], masks: list[int], allowed: list[int], order: str, pivot: int | None = None
    ) -> list[tuple[tuple[int, ...], float, float, tuple[int, ...]]]:
        """(tokens in position order, chain score, HCB score, fill order) of every fill, unsorted."""
        pivot = self.mask_id if pivot is None else pivot
        out = []

        def visit(context: list[int], remaining: list[int], chain: float, hcb: float, done: tuple[int, ...]) -> None:
            if not remaining:
                out.append((tuple(context[m] for m in masks), chain, hcb, done))
                return
            logp = self.logp(tuple(context))
            if order == "l2r":
                position = remaining[0]
            else:  # best-to-worst: the largest log-probability over the vocabulary, ties to the leftmost
                peaks = [logp[p].max() for p in remaining]
                position = remaining[int(np.argmax(peaks))]
            for token in allowed:
                child = list(context)
                child[position] = token
                visit(
                    child,
                    [p for p in remaining if p != position],
                    chain + logp[position, token],
                    hcb + logp[position, token] - logp[position, pivot],
                    (*done, position),
                )

        visit(list(ids), sorted(masks), 0.0, 0.0, ())
        return out


# --- MLM energies and Metropolis-Hastings: every state enumerated ---------------------------------------


class NaiveEnergy:
    """Goyal et al.'s energies and MH quantities the slow way: one sequence per forward pass, full
    logits, float64 model and softmax (see distributed_scoring/engine/sampler.py for the definitions).

    E_raw(X) = -sum_t l_t[x_t] and E_norm(X) = -sum_t log softmax(l_t)[x_t] over the scored positions
    t, l_t the logits at t of X with t alone masked. The proposal at a block B masks all of B at once:
    q_i = softmax over the allowed tokens of l_i / tau, then the top-p nucleus (the most probable tokens,
    ties in token order, until their mass reaches p, the crossing token kept), renormalised.
    """

    def __init__(self, model, mask_id: int) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.mask_id = mask_id
        self._logits: dict[tuple[int, ...], np.ndarray] = {}

    @torch.no_grad()
    def logits(self, ids) -> np.ndarray:
        """(L, V) float64 logits of this exact sequence (mask tokens wherever it has them)."""
        key = tuple(int(i) for i in ids)
        if key not in self._logits:
            self._logits[key] = self.model(input_ids=torch.tensor([list(key)])).logits[0].double().numpy()
        return self._logits[key]

    def masked(self, ids, positions) -> list[int]:
        out = [int(i) for i in ids]
        for p in positions:
            out[p] = self.mask_id
        return out

    def energies(self, ids, scored) -> tuple[float, float]:
        """(E_raw, E_norm) of `ids`, summed over the positions `scored`, one masked copy per position."""
        raw = norm = 0.0
        for t in scored:
            logits = self.logits(self.masked(ids, [t]))[t]
            raw -= logits[ids[t]]
            norm -= logits[ids[t]] - np.logaddexp.reduce(logits)
        return float(raw), float(norm)

    def proposal(self, ids, block, allowed: list[int], temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
        """(|B|, C) log q_i(w) for i in block (ascending), w over `allowed` in that order."""
        logits = self.logits(self.masked(ids, block))
        out = []
        for i in block:
            z = np.array([logits[i][w] for w in allowed]) / temperature
            logq = z - np.logaddexp.reduce(z)
            if top_p < 1:
                probs = np.exp(logq)
                keep, mass = [], 0.0
                for c in np.argsort(-probs, kind="stable"):
                    keep.append(c)
                    mass += probs[c]
                    if mass >= top_p:
                        break
                kept = np.full_like(z, -np.inf)
                kept[keep] = z[keep]
                logq = kept - np.logaddexp.reduce(z[keep])
            out.append(logq)
        return np.array(out)

    def log_acceptance(
        self,
        current,
        proposed,
        block,
        scored,
        allowed: list[int],
        energy: str,
        temperature: float,
        proposal_temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> float:
        """log min(1, exp(-(E(X') - E(X)) / T) q(X|X') / q(X'|X)) for a move of `block` (X, X' agree
        elsewhere); q(X'|X) from X with the block masked, q(X|X') from X' with the block masked."""
        which = 0 if energy == "raw" else 1
        e_cur, e_new = self.energies(current, scored)[which], self.energies(proposed, scored)[which]
        forward = self.proposal(current, block, allowed, proposal_temperature, top_p)
        reverse = self.proposal(proposed, block, allowed, proposal_temperature, top_p)
        log_fwd = sum(forward[k][allowed.index(proposed[i])] for k, i in enumerate(block))
        log_rev = sum(reverse[k][allowed.index(current[i])] for k, i in enumerate(block))
        return min(0.0, -(e_new - e_cur) / temperature + log_rev - log_fwd)

    def states(self, ids, sample, allowed: list[int]) -> list[tuple[int, ...]]:
        """Every fill of the sampled positions with allowed tokens, as token tuples in `sample` order."""
        return list(itertools.product(allowed, repeat=len(sample)))

    def fill(self, ids, sample, state) -> list[int]:
        out = [int(i) for i in ids]
        for p, w in zip(sample, state):
            out[p] = int(w)
        return out

    def target(self, ids, sample, scored, allowed: list[int], energy: str, temperature: float) -> dict:
        """state -> p(state) ∝ exp(-E / T), normalised over every fill of the sampled positions."""
        which = 0 if energy == "raw" else 1
        states = self.states(ids, sample, allowed)
        logits = np.array([-self.energies(self.fill(ids, sample, s), scored)[which] / temperature for s in states])
        probs = np.exp(logits - np.logaddexp.reduce(logits))
        return dict(zip(states, probs.tolist()))


def total_variation(p: dict, q: dict) -> float:
    """1/2 sum_x |p(x) - q(x)| over the union of both supports (missing keys have probability 0)."""
    return 0.5 * sum(abs(p.get(x, 0.0) - q.get(x, 0.0)) for x in set(p) | set(q))


# --- any-order chain rule (u-PMLM): scores and generation --------------------------------------------


class NaiveChain:
    """Liao et al.'s chain rule the slow way: one masked copy per forward pass, full logits, float64
    model and log-softmax over the whole vocabulary (see distributed_scoring/engine/chain.py).

    Step k of an order sigma is the sequence with sigma(k), sigma(k+1), ... holding the mask token and
    every other position as given; its term is log p(x_sigma(k)) at sigma(k).
    """

    def __init__(self, model, mask_id: int) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.mask_id = mask_id

    @torch.no_grad()
    def logp(self, ids: list[int], position: int) -> np.ndarray:
        """(V,) log p at `position` of this exact sequence."""
        logits = self.model(input_ids=torch.tensor([list(ids)])).logits[0, position].double()
        return torch.log_softmax(logits, dim=-1).numpy()

    def terms(self, ids, order) -> list[float]:
        """log p(x_sigma(k) | x_sigma(<k), sigma(>=k) masked, rest) for k = 0 .. T-1."""
        out = []
        for k, position in enumerate(order):
            copy_ids = [int(i) for i in ids]
            for later in order[k:]:
                copy_ids[later] = self.mask_id
            out.append(float(self.logp(copy_ids, position)[ids[position]]))
        return out

    def log_likelihood(self, ids, order) -> float:
        return sum(self.terms(ids, order))

    def greedy(self, ids, order, allowed: list[int]) -> tuple[list[int], float]:
        """Algorithm 1 with argmax: the masked sequence `ids` filled along `order` (positions), at each
        step the allowed token of highest probability (ties: the smaller id); (filled ids, chain score)."""
        context = [int(i) for i in ids]
        score = 0.0
        for position in order:
            logp = self.logp(context, position)
            token = max(allowed, key=lambda t: (logp[t], -t))
            context[position] = token
            score += float(logp[token])
        return context, score


# --- training objectives: u-PMLM and maskless regression ---------------------------------------------


def upmlm_loss(model, mask_id: int, sequences: list[list[int]], masked: list[list[int]]) -> float:
    """Mean over sequences of the mean cross-entropy of its masked tokens: each sequence alone, its
    `masked` positions set to the mask token, full logits, float64 log-softmax."""
    model = copy.deepcopy(model).to(torch.float64).eval()
    losses = []
    with torch.no_grad():
        for ids, positions in zip(sequences, masked):
            inputs = list(ids)
            for p in positions:
                inputs[p] = mask_id
            logits = model(input_ids=torch.tensor([inputs])).logits[0].double()  # (T, V)
            logp = torch.log_softmax(logits, dim=-1)
            losses.append(-sum(float(logp[p, ids[p]]) for p in positions) / len(positions))
    return sum(losses) / len(losses)


def maskless_prediction(
    encoder, head_weight: torch.Tensor, head_bias: torch.Tensor, mean: float, std: float, ids: list[int]
) -> float:
    """A `sentence` student's PLL: -softplus(c - s (w . h_0 + b)), h_0 the final hidden state of the first token
    of the unpadded sentence, c = softplus^-1(-mean) and s = std / softplus'(c) (so that a head giving 0
    predicts the mean, with slope std), all in float64 from their definitions."""
    encoder = copy.deepcopy(encoder).to(torch.float64).eval()
    with torch.no_grad():
        first = encoder(input_ids=torch.tensor([ids]))[0][0, 0].double()  # (H,)
    a = float(first @ head_weight.detach().double().reshape(-1) + head_bias.detach().double().reshape(()))
    c = math.log(math.expm1(-mean))
    s = std * (1 + math.exp(-c))
    x = c - s * a
    return -(max(x, 0.0) + math.log1p(math.exp(-abs(x))))


def unmasked_logprobs(model, tokenizer, text: str) -> np.ndarray:
    """`--method unmasked` (and an untrained per-token student): log q(w_t | W) at each scored position of
    the unmasked sentence, one forward pass, full logits, float64 model and log-softmax."""
    model = copy.deepcopy(model).to(torch.float64).eval()
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)  # (T, V)
    return np.array([float(logp[t, ids[t]]) for t in scored_positions(tokenizer, ids)])


def distillation_loss(
    model,
    sequences: list[list[int]],
    scored: list[list[int]],
    token_targets: list[list[float]],
    cond_ids: list,
    cond_logprobs: list,
    cond_rest: list,
    token_weight: float,
    kl_weight: float,
) -> float:
    """A per-token student's loss from its definition: over every scored token of every sequence (each
    sequence alone, unmasked, float64), token_weight (log q_t(w_t) - target_t)^2 + kl_weight KL(p_t || q_t),
    p_t given by its top tokens and the mass of the rest (one bucket), then the mean over tokens."""
    model = copy.deepcopy(model).to(torch.float64).eval()
    terms = []
    with torch.no_grad():
        for b, ids in enumerate(sequences):
            logq = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)  # (T, V)
            for k, t in enumerate(scored[b]):
                term = token_weight * (float(logq[t, ids[t]]) - token_targets[b][k]) ** 2 if token_weight else 0.0
                if kl_weight:
                    top = [int(i) for i in cond_ids[b][k]]
                    kl = sum(math.exp(p) * (p - float(logq[t, i])) for i, p in zip(top, cond_logprobs[b][k]))
                    rest = cond_rest[b][k]
                    if rest > float("-inf"):
                        others = [float(logq[t, v]) for v in range(logq.shape[1]) if v not in top]
                        kl += math.exp(rest) * (rest - math.log(sum(math.exp(x) for x in others)))
                    term += kl_weight * kl
                terms.append(term)
    return sum(terms) / len(terms)


# --- protein variant effects: the four scoring strategies ---------------------------------------------

Site = tuple[int, str, str]  # (0-based residue position, wild-type residue, mutant residue)


def mutant_of(wild_type: str, sites: list[Site]) -> str:
    """The mutant sequence: the wild type with each site's residue replaced (which must be the wild type's)."""
    residues = list(wild_type)
    for i, wt, mt in sites:
        assert residues[i] == wt, f"site {i}{wt}{mt}: the wild type has {residues[i]} there"
        residues[i] = mt
    return "".join(residues)


def sites_of(wild_type: str, mutant: str) -> list[Site]:
    """The sites at which two sequences of one length differ."""
    assert len(wild_type) == len(mutant)
    return [(i, w, m) for i, (w, m) in enumerate(zip(wild_type, mutant)) if w != m]


class NaiveVariants:
    """Meier et al.'s (2021) scores of protein variants, the slow way: one forward pass per sequence or
    masked copy, each alone (no batching, no padding), full logits, float64 model and log-softmax over the
    whole vocabulary.

    A sequence is a string of residues, one token each; the tokenizer reads it with the residues separated
    by spaces, and residue i's token is the i-th token that is not a sequence-level special
    (`scored_positions`), checked to be that residue's own token. A variant is a list of sites (i, wt, mt),
    or its mutant sequence. For a wild type W, a variant with sites S and its mutant M:
      wt-marginal: sum over S of log p(mt | W)[i] - log p(wt | W)[i];
      masked-marginal: the same with position i masked in W, one masked copy per site;
      mutant-marginal: the same read from M unmasked;
      pll: PLL(M) - PLL(W), PLL the sum over every residue t of log p(x_t | the sequence with t masked).
    """

    def __init__(self, model, tokenizer) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.tokenizer = tokenizer

    def encode(self, sequence: str) -> tuple[list[int], list[int]]:
        """(token ids with the specials, the position of each residue's token)."""
        ids = self.tokenizer(" ".join(sequence))["input_ids"]
        positions = scored_positions(self.tokenizer, ids)
        assert self.tokenizer.convert_ids_to_tokens([ids[p] for p in positions]) == list(sequence), sequence
        return ids, positions

    def residue_id(self, residue: str) -> int:
        token = self.tokenizer.convert_tokens_to_ids(residue)
        assert token != self.tokenizer.unk_token_id, residue
        return token

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """(T, V) log p at every position of this exact sequence, alone."""
        logits = self.model(input_ids=torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, dim=-1)

    def conditionals(self, sequence: str, masked: bool) -> np.ndarray:
        """(L, V): at each residue i, log p(. | the sequence with i masked) or log p(. | the sequence)[i]."""
        ids, positions = self.encode(sequence)
        if not masked:
            return self.logprobs(ids)[positions].numpy()
        out = []
        for p in positions:
            copy_ids = list(ids)
            copy_ids[p] = self.tokenizer.mask_token_id
            out.append(self.logprobs(copy_ids)[p].numpy())
        return np.array(out)

    def sites(self, wild_type: str, variant) -> list[Site]:
        return sites_of(wild_type, variant) if isinstance(variant, str) else list(variant)

    def difference(self, logp: np.ndarray, site: Site) -> float:
        """log p(mt) - log p(wt) of one site from a (V,) log-probability row."""
        _, wt, mt = site
        return float(logp[self.residue_id(mt)] - logp[self.residue_id(wt)])

    def wt_marginal(self, wild_type: str, variants: list) -> np.ndarray:
        out = []
        for variant in variants:
            sites = self.sites(wild_type, variant)
            mutant_of(wild_type, sites)  # checks the sites' wild-type residues
            ids, positions = self.encode(wild_type)
            logp = self.logprobs(ids).numpy()
            out.append(sum(self.difference(logp[positions[i]], (i, wt, mt)) for i, wt, mt in sites))
        return np.array(out)

    def masked_marginal(self, wild_type: str, variants: list) -> np.ndarray:
        out = []
        for variant in variants:
            sites = self.sites(wild_type, variant)
            mutant_of(wild_type, sites)
            ids, positions = self.encode(wild_type)
            total = 0.0
            for i, wt, mt in sites:
                copy_ids = list(ids)
                copy_ids[positions[i]] = self.tokenizer.mask_token_id
                total += self.difference(self.logprobs(copy_ids)[positions[i]].numpy(), (i, wt, mt))
            out.append(total)
        return np.array(out)

    def mutant_marginal(self, wild_type: str, variants: list) -> np.ndarray:
        out = []
        for variant in variants:
            sites = self.sites(wild_type, variant)
            ids, positions = self.encode(mutant_of(wild_type, sites))
            logp = self.logprobs(ids).numpy()
            out.append(sum(self.difference(logp[positions[i]], (i, wt, mt)) for i, wt, mt in sites))
        return np.array(out)

    def pll(self, sequence: str) -> float:
        """sum over every residue t of log p(x_t | the sequence with t masked)."""
        ids, positions = self.encode(sequence)
        table = self.conditionals(sequence, masked=True)
        return float(sum(row[ids[p]] for p, row in zip(positions, table)))

    def pll_difference(self, wild_type: str, variants: list) -> np.ndarray:
        reference = self.pll(wild_type)
        return np.array([self.pll(mutant_of(wild_type, self.sites(wild_type, v))) - reference for v in variants])

    def scores(self, strategy: str, wild_type: str, variants: list) -> np.ndarray:
        """One strategy's score of each variant: "wt-marginal", "masked-marginal", "mutant-marginal" or "pll"."""
        method = {
            "wt-marginal": self.wt_marginal,
            "masked-marginal": self.masked_marginal,
            "mutant-marginal": self.mutant_marginal,
            "pll": self.pll_difference,
        }[strategy]
        return method(wild_type, variants)
