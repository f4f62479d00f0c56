"""The training loop and its objectives, without Ray: losses against the naive references, the u-PMLM
masks, the batch order, resuming from a saved state, a few steps lowering the loss, a per-token student
reaching a target it can represent exactly, frozen layers left as they were."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.masking import Sentence
from distributed_scoring.engine.maskless import MasklessEngine, Student, regressor_for
from distributed_scoring.engine.training import (
    Example,
    PMLMObjective,
    Schedule,
    SentenceObjective,
    TokenObjective,
    TrainState,
    batch_rows,
    fit,
    freeze_lower,
    upmlm_positions,
)
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers import tiny
from helpers.reference import distillation_loss, maskless_prediction, upmlm_loss


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices on a shared 2-core machine: a second thread only waits for the first."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def examples_of(mlm) -> list[Example]:
    """The tiny corpus as training examples; targets like PLLs: about -3 nats a token, plus a wiggle."""
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(tiny.CORPUS)
    return [
        Example(
            np.asarray(p.input_ids, dtype=np.int64),
            np.asarray(p.targets, dtype=np.int64),
            -3.0 * len(p.targets) + 4 * np.sin(i),
        )
        for i, p in enumerate(prepared)
    ]


def test_upmlm_masks_a_uniform_number_of_scorable_positions():
    candidates = np.arange(2, 12)  # ten scorable positions
    generator = torch.Generator().manual_seed(0)
    counts = Counter()
    for _ in range(2000):
        rows, positions = upmlm_positions([candidates], generator)
        assert (rows == 0).all() and set(positions) <= set(candidates)
        assert len(set(positions)) == len(positions) and (np.diff(positions) > 0).all()
        counts[len(positions)] += 1
    assert set(counts) == set(range(1, 11))
    assert all(130 <= c <= 270 for c in counts.values()), counts  # 200 each; 5 sigma is about 65
    again = upmlm_positions([candidates, candidates[:3]], torch.Generator().manual_seed(7))
    same = upmlm_positions([candidates, candidates[:3]], torch.Generator().manual_seed(7))
    assert all((a == b).all() for a, b in zip(again, same))


def test_batches_cover_each_epoch_once_whatever_the_number_of_workers():
    schedule = Schedule(steps=6, batch_size=4, lr=1e-3, seed=3, checkpoint_every=10)
    for world in (1, 2, 4):
        epoch = [np.concatenate([batch_rows(step, 10, schedule, r, world) for r in range(world)]) for step in (0, 1)]
        assert all(len(b) == 4 for b in epoch)
        assert len(set(np.concatenate(epoch))) == 8  # whole batches only: 2 of the 10 sit the epoch out
        assert sorted(np.concatenate(epoch)) == sorted(
            np.concatenate([batch_rows(step, 10, schedule, 0, 1) for step in (0, 1)])
        )
    assert not np.array_equal(batch_rows(0, 10, schedule, 0, 1), batch_rows(2, 10, schedule, 0, 1))


def test_pmlm_loss_equals_the_naive_reference(tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    objective = PMLMObjective(mlm)
    examples = examples_of(mlm)[:5]
    got = objective.loss(objective.module.eval(), examples, torch.Generator().manual_seed(11))
    rows, positions = upmlm_positions([e.positions for e in examples], torch.Generator().manual_seed(11))
    masked = [positions[rows == b].tolist() for b in range(len(examples))]
    expected = upmlm_loss(mlm.model, mlm.mask_token_id, [e.input_ids.tolist() for e in examples], masked)
    assert expected > 1.0
    assert abs(float(got.detach()) - expected) < 1e-5


def test_sentence_loss_is_the_squared_error_of_the_prediction_over_std(tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    examples = examples_of(mlm)[:6]
    regressor = regressor_for(mlm, mean=-40.0, std=12.0).eval()
    torch.nn.init.normal_(regressor.head.weight, std=0.5, generator=torch.Generator().manual_seed(0))  # seeded
    got = SentenceObjective(regressor, mlm).loss(regressor, examples, torch.Generator())
    head = regressor.head
    predicted = [
        maskless_prediction(mlm.encoder, head.weight, head.bias, -40.0, 12.0, e.input_ids.tolist()) for e in examples
    ]
    expected = np.mean([((p - e.target) / 12.0) ** 2 for p, e in zip(predicted, examples)])
    assert abs(float(got.detach()) - expected) < 1e-5 * max(1.0, expected)  # fp32 against float64


@pytest.mark.parametrize("objective, drop", [("maskless", 0.3), ("pmlm", 0.05)])
def test_a_few_steps_lower_the_loss(objective, drop, tiny_model_dir):
    """Seeded, so not flaky. u-PMLM's loss is noisy (a new masking ratio per sequence) and the random tiny
    model starts over-confident: it first falls towards log |V|."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    examples = examples_of(mlm)
    targets = np.array([e.target for e in examples])
    trained = (
        SentenceObjective(regressor_for(mlm, targets.mean(), targets.std()), mlm)
        if objective == "maskless"
        else PMLMObjective(mlm)
    )
    losses = []
    steps = fit(trained, examples, Schedule(60, 4, 1e-3, 0, 1000), lambda step, m, save: losses.append(m["loss"]))
    assert steps == 60 and len(losses) == 60
    assert np.mean(losses[-10:]) < (1 - drop) * np.mean(losses[:10]), (losses[:10], losses[-10:])


@pytest.mark.parametrize("objective", ["pmlm", "distribution"])
def test_a_run_resumed_from_its_state_ends_where_the_uninterrupted_run_does(objective, tiny_model_dir, tmp_path):
    """Same batches, masks and dropout after a resume: the weights after 6 steps are the same whether the
    run stopped at step 3 or not."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    examples = distilled(mlm, shifted(mlm, 1)) if objective == "distribution" else examples_of(mlm)
    schedule = Schedule(6, 4, 1e-3, 5, checkpoint_every=3)

    def run(resume=None, keep_at=None):
        mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
        objective_ = TokenObjective(mlm, 0.5, 1.0) if objective == "distribution" else PMLMObjective(mlm)

        def on_step(step, metrics, save):
            if save is not None and step == keep_at:
                save(str(tmp_path))

        fit(objective_, examples, schedule, on_step, resume=resume)
        return objective_.module.state_dict()

    straight = run(keep_at=3)
    assert TrainState.load(tmp_path).step == 3
    resumed = run(resume=str(tmp_path))
    for name, value in straight.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-6, msg=name)
    fresh = load_masked_lm(ModelSpec(str(tiny_model_dir("bert")))).model.state_dict()
    assert any(
        not torch.equal(fresh[k.removeprefix("model.")], v) for k, v in straight.items() if k.startswith("model.")
    )


def shifted(mlm, seed: int) -> torch.nn.Module:
    """A copy of the masked LM with its output bias moved by N(0, 1) per token: the target of a per-token
    student that it can represent exactly (by learning that bias)."""
    import copy

    teacher = copy.deepcopy(mlm.model)
    bias = teacher.get_output_embeddings().bias
    with torch.no_grad():
        bias.add_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(seed)))
    return teacher


def distilled(mlm, teacher: torch.nn.Module, k: int | None = None) -> list[Example]:
    """The tiny corpus with per-token targets read from `teacher` on the unmasked sentences (its log q(w_t)
    and its top-k distribution, all of it by default), as a teacher run would give them."""
    import copy

    student = copy.deepcopy(mlm)
    student.model = teacher.eval()
    student.head = None
    engine = MasklessEngine(Student(student, None, {}, {}))
    out = []
    for p in PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(tiny.CORPUS):
        ids, positions = np.asarray(p.input_ids, dtype=np.int64), np.asarray(p.targets, dtype=np.int64)
        terms = engine.predict([Sentence(ids, positions, np.asarray(p.piece_words))])[0].token_logprobs
        with torch.no_grad():
            logp = torch.log_softmax(teacher(input_ids=torch.from_numpy(ids[None])).logits[0, positions].double(), -1)
        top, top_ids = logp.topk(k or logp.shape[1], dim=-1)
        rest = logp.scatter(1, top_ids, float("-inf")).logsumexp(1)
        out.append(Example(ids, positions, float(terms.sum()), terms, top_ids.numpy(), top.numpy(), rest.numpy()))
    return out


@pytest.mark.parametrize("weights, k", [((1.0, 0.0), None), ((0.5, 1.0), 3), ((0.0, 1.0), None)])
def test_per_token_losses_equal_the_naive_reference(weights, k, tiny_model_dir):
    """token (1, 0), distribution with the token term over a top-3 conditional (the rest one bucket), and
    distribution alone over the whole conditional."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    examples = distilled(mlm, shifted(mlm, 3), k)[:5]
    objective = TokenObjective(mlm, *weights)
    got = float(objective.loss(objective.module.eval(), examples, torch.Generator()).detach())
    expected = distillation_loss(
        mlm.model,
        [e.input_ids.tolist() for e in examples],
        [e.positions.tolist() for e in examples],
        [e.token_targets.tolist() for e in examples],
        [e.cond_ids for e in examples],
        [e.cond_logprobs.tolist() for e in examples],
        [e.cond_rest.tolist() for e in examples],
        *weights,
    )
    assert expected > 0.05
    assert abs(got - expected) < 1e-5 * max(1.0, expected)


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 1.0)])
def test_a_per_token_student_reaches_a_target_it_can_represent_exactly(weights, tiny_model_dir):
    """The targets are the model's own unmasked predictions with its output bias shifted: a student that
    learns the shift matches them exactly, so its loss must go to about 0 (token: squared error of the
    terms; distribution: the KL to the whole conditional)."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    examples = distilled(mlm, shifted(mlm, 2))
    mlm.model.config.hidden_dropout_prob = mlm.model.config.attention_probs_dropout_prob = 0.0
    for module in mlm.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # an exact target needs a deterministic student
    objective = TokenObjective(mlm, *weights)
    losses = []
    fit(objective, examples, Schedule(300, 7, 3e-2, 0, 1000), lambda step, m, save: losses.append(m["loss"]))
    final = float(objective.loss(objective.module.eval(), examples, torch.Generator()).detach())
    assert losses[0] > 0.3, losses[:3]
    assert final < 0.01 * losses[0] and final < 5e-3, (losses[0], final)


def test_frozen_layers_stay_as_they_were(tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    before = {k: v.clone() for k, v in mlm.model.state_dict().items()}
    freeze_lower(mlm.model, 1)
    objective = TokenObjective(mlm, 1.0, 0.0)
    fit(objective, distilled(mlm, shifted(mlm, 4)), Schedule(4, 4, 1e-2, 0, 1000), lambda *a: None)
    after = mlm.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert not any(k.startswith(("bert.embeddings.", "bert.encoder.layer.0.")) for k in changed), changed
    assert any(k.startswith("bert.encoder.layer.1.") for k in changed) and "cls.predictions.bias" in changed
    with pytest.raises(ValueError, match="cannot freeze 3 layers"):
        freeze_lower(mlm.model, 3)
