"""Static evaluation (deterministic, Monte-Carlo dropout, temperature, test protocol) and dynamic evaluation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.trainers import (
    DynamicEvaluationConfig,
    MarkovCorpusConfig,
    Schedule,
    TrainingConfig,
    cross_entropy,
    dynamic_cross_entropy,
    evaluate_checkpoint,
    gradient_rms,
    load_checkpoint,
    load_corpus,
    monte_carlo_cross_entropy,
    search_logit_scale,
    train,
)
from lm_tuner.trainers.batching import batchify
from lm_tuner.trainers.evaluation import LOGIT_SCALES, streams_cross_entropy

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # numbers independent of the thread count


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small model with dropout, trained a little on a Markov corpus; its best checkpoint's path."""
    corpus = load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=8000, valid_tokens=1000, test_tokens=1000))
    model_config = ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=24, num_layers=2,
                               input_dropout=0.3, state_dropout=0.3, output_dropout=0.3)
    path = tmp_path_factory.mktemp("trained") / "best.pt"
    config = TrainingConfig(schedule=Schedule(turns=2, steps_per_turn=40, batch_size=16, bptt=20), learning_rate=0.01)
    train(model_config, config, corpus, checkpoint_path=path, device=torch.device("cpu"))
    return corpus, path


def test_monte_carlo_with_multiplier_zero_equals_deterministic_evaluation(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    deterministic = cross_entropy(model, corpus.valid, 4, 20)
    for samples in (1, 3):
        mc = monte_carlo_cross_entropy(model, corpus.valid, 4, 20, multiplier=0.0, samples=samples, max_rows=8)
        assert mc == pytest.approx(deterministic, rel=1e-6)
    assert not model.training


def test_monte_carlo_averages_probabilities_over_fresh_masks(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    torch.manual_seed(0)
    single = monte_carlo_cross_entropy(model, corpus.valid, 4, 20, multiplier=1.0, samples=1)
    torch.manual_seed(0)
    many = monte_carlo_cross_entropy(model, corpus.valid, 4, 20, multiplier=1.0, samples=6, max_rows=8)
    assert many < single  # averaging probabilities of several masks beats one mask
    assert math.isfinite(many)


def test_temperature_search_walks_the_grid_and_stops_after_two_misses(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    search = search_logit_scale(model, corpus.valid, 4, 20, tokens=600)
    tried = list(search.losses)
    assert tried == list(LOGIT_SCALES[: len(tried)])
    assert search.loss == min(search.losses.values()) == search.losses[search.logit_scale]
    after_best = tried[tried.index(search.logit_scale) + 1:]
    assert len(after_best) == 2 or tried[-1] == LOGIT_SCALES[-1]
    first_windows = batchify(corpus.valid, 4)[: 600 // (4 * 20) * 20 + 1]  # the whole windows that fit in 600 tokens
    assert search.loss == pytest.approx(
        streams_cross_entropy(model, first_windows, 20, logit_scale=search.logit_scale), rel=1e-12)


def test_test_protocol_scores_each_split_as_one_stream(trained) -> None:
    corpus, path = trained
    result = evaluate_checkpoint(path, corpus, bptt=50, mc_samples=2, mc_multipliers=(0.0,))
    model = load_checkpoint(path).model
    scale = search_logit_scale(model, corpus.valid, 1, 50).logit_scale
    assert result.logit_scale == scale
    assert result.valid == cross_entropy(model, corpus.valid, 1, 50, logit_scale=scale)
    assert result.test == cross_entropy(model, corpus.test, 1, 50, logit_scale=scale)
    assert result.mc_test == pytest.approx(result.test, rel=1e-6)


def test_dynamic_evaluation_with_zero_learning_rate_equals_static_evaluation(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    rms = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=5)
    config = DynamicEvaluationConfig(max_time_steps=7, learning_rate=0.0, decay=0.01)
    assert dynamic_cross_entropy(model, corpus.valid, rms, config) == cross_entropy(model, corpus.valid, 1, 7)


def repeated_segments(vocabulary: int, segment: int, repeats: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocabulary, (segment,), generator=generator).repeat(repeats)


def test_dynamic_evaluation_learns_repeated_segments_and_restores_the_weights(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    rms = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=5)
    text = repeated_segments(len(corpus.vocabulary), segment=40, repeats=10)
    static = cross_entropy(model, text, 1, 5)
    config = DynamicEvaluationConfig(max_time_steps=5, learning_rate=3e-3, decay=1e-3, epsilon=1e-5)
    first = dynamic_cross_entropy(model, text, rms, config)
    assert first < static - 0.5
    assert dynamic_cross_entropy(model, text, rms, config) == first  # every pass starts from theta_0
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_dynamic_evaluation_scores_a_segment_before_adapting_to_it(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    rms = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=5)
    config = DynamicEvaluationConfig(max_time_steps=5, learning_rate=1e-1, decay=0.0)
    one_segment = corpus.valid[:6]
    assert dynamic_cross_entropy(model, one_segment, rms, config) == cross_entropy(model, one_segment, 1, 5)
    assert dynamic_cross_entropy(model, corpus.valid[:11], rms, config) != cross_entropy(model, corpus.valid[:11], 1, 5)


def dynamic_cross_entropy_by_the_formula(model: LanguageModel, text: torch.Tensor, rms: list[torch.Tensor],
                                         config: DynamicEvaluationConfig) -> float:
    """The specification written out with plain autograd: score a segment, then
    theta <- theta - eta g / (MS + eps) + lambda min(RMSnorm, 1 / lambda) (theta_0 - theta)."""
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    mean_rms = torch.cat([ms.flatten() for ms in rms]).mean()
    state, losses = model.initial_state(1), []
    stream, step = text.view(-1, 1), config.max_time_steps
    for start in range(0, len(text) - 1, step):
        targets = stream[start + 1 : start + 1 + step]
        inputs = stream[start : start + len(targets)]
        logits, state = model(inputs, [tuple(t.detach() for t in layer) for layer in state])
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        losses.append(nll.detach())
        grads = torch.autograd.grad(nll.mean(), params)
        with torch.no_grad():
            for p, p0, g, ms in zip(params, initial, grads, rms, strict=True):
                decay = torch.clamp(config.decay * ms / mean_rms, max=1.0)
                p.copy_(p - config.learning_rate * g / (ms + config.epsilon) + decay * (p0 - p))
    with torch.no_grad():
        for p, p0 in zip(params, initial, strict=True):
            p.copy_(p0)
    return torch.cat(losses).double().mean().item()


@pytest.mark.parametrize("tied", [True, False])
def test_dynamic_evaluation_updates_every_weight_as_the_formula_says(tied: bool) -> None:
    """Tied and untied embeddings: the lookup's gradient reaches only the rows of the segment's tokens
    (repeated tokens summed), the softmax's reaches every row, and the decay moves every weight."""
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=12, hidden_size=10, num_layers=2, tie_embeddings=tied)).eval()
    text = torch.tensor([3, 5, 3, 3, 7, 1, 5, 9, 3, 0, 11, 3, 5, 2, 8, 3])
    rms = [torch.rand_like(p) + 0.05 for p in model.parameters()]
    config = DynamicEvaluationConfig(max_time_steps=4, learning_rate=1.0, decay=0.2, epsilon=1e-3)
    expected = dynamic_cross_entropy_by_the_formula(model, text, rms, config)
    assert abs(expected - cross_entropy(model, text, 1, 4)) > 0.01  # the updates change the score
    assert dynamic_cross_entropy(model, text, rms, config) == pytest.approx(expected, rel=1e-6)


def test_monte_carlo_dynamic_evaluation_averages_passes_that_each_start_from_theta_0(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    rms = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=5)
    config = DynamicEvaluationConfig(max_time_steps=5, learning_rate=3e-3, decay=1e-3)
    text = corpus.valid[:300]
    deterministic = dynamic_cross_entropy(model, text, rms, config)
    assert dynamic_cross_entropy(model, text, rms, config, mc_samples=2, mc_multiplier=0.0) == pytest.approx(
        deterministic, rel=1e-9)
    torch.manual_seed(0)
    noisy = dynamic_cross_entropy(model, text, rms, config, mc_samples=2, mc_multiplier=1.0)
    assert math.isfinite(noisy) and noisy != deterministic
    assert dynamic_cross_entropy(model, text, rms, config) == deterministic


def test_decay_alone_keeps_the_weights_at_theta_0(trained) -> None:
    """With the decay clipped at 1/lambda, lambda * RMSnorm <= 1: a huge lambda pulls the weights all the
    way back to theta_0 after every update, never past it."""
    corpus, path = trained
    model = load_checkpoint(path).model
    rms = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=5)
    text = repeated_segments(len(corpus.vocabulary), segment=40, repeats=3)
    tiny_steps = DynamicEvaluationConfig(max_time_steps=5, learning_rate=1e-9, decay=1e6)
    static = cross_entropy(model, text, 1, 5)
    assert dynamic_cross_entropy(model, text, rms, tiny_steps) == pytest.approx(static, rel=1e-5)


def test_gradient_statistics_are_root_mean_squares_with_dropout_off(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model.train()
    one_window = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=1)
    batched = batchify(corpus.train, 32)
    model.eval()
    logits, _ = model(batched[:20], model.initial_state(32))
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batched[1:21].reshape(-1)).backward()
    for ms, param in zip(one_window, model.parameters(), strict=True):
        torch.testing.assert_close(ms, param.grad.abs())
    model.train()
    three = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=3)
    again = gradient_rms(model, corpus.train, batch_size=32, bptt=20, max_windows=3)
    assert all(torch.equal(a, b) for a, b in zip(three, again, strict=True))  # no dropout noise
    assert model.training and all(p.grad is None for p in model.parameters())


def test_a_fresh_model_has_near_uniform_loss(tmp_path: Path) -> None:
    model = LanguageModel(ModelConfig(vocab_size=50, hidden_size=8, num_layers=1))
    loss = cross_entropy(model, torch.randint(0, 50, (500,)), 2, 10)
    assert loss == pytest.approx(math.log(50), rel=0.1)


def test_windows_carry_the_state_so_their_length_does_not_change_the_loss(trained) -> None:
    corpus, path = trained
    model = load_checkpoint(path).model
    batched = batchify(corpus.valid, 4)
    with torch.no_grad():  # reference: each stream in one forward pass, no windows at all
        logits, _ = model(batched[:-1], model.initial_state(4))
        whole = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batched[1:].reshape(-1))
    for bptt in (7, 20, 1000):
        assert cross_entropy(model, corpus.valid, 4, bptt) == pytest.approx(whole.item(), rel=1e-5)
    assert not model.training and all(p.grad is None for p in model.parameters())


def test_a_mogrifier_evaluates_with_several_threads():
    """The mogrifier's CPU kernels split the batch over threads and update buffers in place: evaluation must not
    make them inference tensors (as torch.inference_mode would)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        model = LanguageModel(ModelConfig(vocab_size=100, hidden_size=64, family="mogrifier", mogrifier_rounds=2,
                                          mogrifier_rank=14)).eval()
        loss = cross_entropy(model, torch.randint(0, 100, (2000,)), batch_size=16, bptt=35)
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(loss) and 4.0 < loss < 5.5  # about ln(100) for an untrained model
