"""AWD-LSTM in training: the AR/TAR penalty (trainers/objective.py), its place in a step's loss, and whole runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lm_tuner.models import ModelConfig
from lm_tuner.models.awd_lstm import AWDLanguageModel
from lm_tuner.trainers import MarkovCorpusConfig, NTASGDConfig, Schedule, TrainingConfig, load_checkpoint, load_corpus
from lm_tuner.trainers import train as train_model
from lm_tuner.trainers import training_run as training_module
from lm_tuner.trainers.objective import activation_regularisation, ar_tar
from lm_tuner.trainers.training_run import TrainingRun

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=4000, valid_tokens=600, test_tokens=600))


def awd(corpus, **fields) -> ModelConfig:
    return ModelConfig(**{"vocab_size": len(corpus.vocabulary), "hidden_size": 16, "family": "awd_lstm",
                          "num_layers": 3, "input_embedding_ratio": 0.5, "cap_input_gate": False} | fields)


def test_ar_and_tar_on_a_hand_computed_example():
    raw = torch.tensor([[[1.0, 2.0]], [[3.0, 5.0]]])  # (time 2, batch 1, units 2)
    dropped = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])
    # AR: 2 * mean(4, 0, 0, 16) = 10; TAR: 1 * mean((3 - 1)^2, (5 - 2)^2) = 6.5
    assert ar_tar(raw, dropped, alpha=2.0, beta=1.0).item() == 16.5
    assert ar_tar(raw, dropped, alpha=2.0, beta=0.0).item() == 10.0
    assert ar_tar(raw, dropped, alpha=0.0, beta=1.0).item() == 6.5
    assert ar_tar(raw[:1], dropped[:1], alpha=0.0, beta=1.0).item() == 0.0  # one step: no change to penalise


def test_the_penalty_is_computed_from_the_models_last_training_pass(corpus):
    torch.manual_seed(0)
    model = AWDLanguageModel(awd(corpus, ar_alpha=2.0, tar_beta=1.0, output_dropout=0.5))
    raw, dropped = [], []
    model.layers[-1].register_forward_hook(lambda module, args, result: raw.append(result[0]))
    logits_of = model._logits
    model._logits = lambda output: dropped.append(output) or logits_of(output)  # what the softmax is given
    tokens = torch.randint(24, (5, 3), generator=torch.Generator().manual_seed(0))
    model(tokens, model.initial_state(3))
    expected = 2.0 * dropped[0].pow(2).mean() + (raw[0][1:] - raw[0][:-1]).pow(2).mean()
    penalty = activation_regularisation(model)
    assert penalty.requires_grad and penalty.item() == pytest.approx(expected.item(), rel=1e-6)
    assert not torch.equal(dropped[0], raw[0])  # AR reads the dropped outputs, TAR the raw ones
    assert activation_regularisation(model) is None  # taken by the step it belongs to
    model.eval()
    model(tokens, model.initial_state(3))
    assert activation_regularisation(model) is None


def _gradients_of_one_step(corpus, monkeypatch, penalty_of) -> dict[str, torch.Tensor]:
    """The gradients one step leaves, with the step's penalty replaced by penalty_of(model, penalty)."""
    config = TrainingConfig(schedule=Schedule(turns=1, steps_per_turn=1, batch_size=4, bptt=7, eval_batch_size=4,
                                              max_grad_norm=1e9), learning_rate=0.01)
    run = TrainingRun(awd(corpus, ar_alpha=2.0, tar_beta=1.0), config, corpus, CPU)
    monkeypatch.setattr(run.optimizer, "step", lambda: None)  # the weights stay, the gradients too
    monkeypatch.setattr(training_module, "activation_regularisation",
                        lambda model: penalty_of(model, activation_regularisation(model)))
    inputs, targets, _ = run.stream.next_window()
    run._step(inputs, targets)
    return {name: p.grad.clone() for name, p in run.model.named_parameters()}


def test_a_step_adds_the_penalty_times_the_window_length_to_the_summed_loss(corpus, monkeypatch):
    without = _gradients_of_one_step(corpus, monkeypatch, lambda model, penalty: None)
    bias_only = _gradients_of_one_step(corpus, monkeypatch, lambda model, penalty: model.output_bias[0] * 1.0)
    difference = {name: bias_only[name] - without[name] for name in without}
    assert difference.pop("output_bias")[0].item() == pytest.approx(7.0)  # d(7 * b_0) / d b_0, 7 steps a window
    assert all(torch.equal(grad, torch.zeros_like(grad)) for grad in difference.values())
    regularised = _gradients_of_one_step(corpus, monkeypatch, lambda model, penalty: penalty)
    assert not torch.equal(regularised["layers.2.cell.recurrent.weight"], without["layers.2.cell.recurrent.weight"])


def test_the_family_trains_through_train_and_its_checkpoint_loads(corpus, tmp_path: Path):
    schedule = Schedule(turns=3, steps_per_turn=5, batch_size=8, bptt=10, eval_batch_size=4, variable_bptt=True,
                        averaging=NTASGDConfig(interval=1))
    regularised = awd(corpus, weight_drop=0.5, ar_alpha=2.0, tar_beta=1.0, input_dropout=0.4,
                      inter_layer_dropout=0.3, output_dropout=0.4, embedding_dropout=0.1)
    config = TrainingConfig(schedule=schedule, learning_rate=0.01, l2_penalty=1.2e-6)
    result = train_model(regularised, config, corpus, checkpoint_path=tmp_path / "best.pt", device=CPU)
    assert len(result.turns) == 3 and all(torch.isfinite(torch.tensor(t.val_loss)) for t in result.turns)
    assert result.best_val_loss < torch.log(torch.tensor(24.0)).item()  # better than uniform
    checkpoint = load_checkpoint(tmp_path / "best.pt")
    assert isinstance(checkpoint.model, AWDLanguageModel) and checkpoint.model.config == regularised
    plain = train_model(awd(corpus), config, corpus, device=CPU)
    assert [t.train_loss for t in plain.turns] != [t.train_loss for t in result.turns]
