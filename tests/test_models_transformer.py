"""The Transformer family: causality, the budget solved to a width its heads divide, learned and rotary positions
training, rotary's relative positions, the token context it reads windows after, and dynamic evaluation on it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from lm_tuner.models import LanguageModel, ModelConfig, count_parameters, solve_hidden_size
from lm_tuner.models.budget import count_parameters_by_building, parameter_breakdown
from lm_tuner.models.transformer import TransformerLanguageModel
from lm_tuner.models.transformer_block import rotate
from lm_tuner.trainers import (
    DynamicEvaluationConfig,
    MarkovCorpusConfig,
    Schedule,
    TrainingConfig,
    cross_entropy,
    dynamic_cross_entropy,
    gradient_rms,
    load_corpus,
    train,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")


def transformer(hidden: int = 16, heads: int = 2, rotary: bool = True, context: int = 8, **fields) -> ModelConfig:
    options = (("attention_heads", heads), ("rotary_positions", rotary), ("context_length", context))
    return ModelConfig(vocab_size=fields.pop("vocab_size", 13), hidden_size=hidden, family="transformer",
                       options=options, **fields)


@pytest.mark.parametrize("rotary", [False, True])
def test_a_later_token_leaves_earlier_logits_unchanged(rotary):
    torch.manual_seed(0)
    model = LanguageModel(transformer(rotary=rotary, num_layers=2)).eval()
    assert isinstance(model, TransformerLanguageModel)
    tokens = torch.randint(13, (8, 3), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[5] = (changed[5] + 1) % 13
    before, _ = model(tokens, model.initial_state(3))
    after, _ = model(changed, model.initial_state(3))
    torch.testing.assert_close(after[:5], before[:5], rtol=0, atol=0)
    assert not torch.allclose(after[5:], before[5:])


@pytest.mark.parametrize(("heads", "rotary"), [(3, False), (4, True), (5, True)])
def test_the_budget_is_solved_to_the_largest_width_its_heads_divide(heads, rotary):
    shape = transformer(hidden=1, heads=heads, rotary=rotary, context=70, vocab_size=500, num_layers=2,
                        input_embedding_ratio=0.6)
    budget = 300_000
    solved = solve_hidden_size(shape, budget)
    multiple = heads * (2 if rotary else 1)
    assert solved.hidden_size % multiple == 0
    assert count_parameters(solved) == count_parameters_by_building(solved) <= budget
    assert count_parameters_by_building(replace(solved, hidden_size=solved.hidden_size + multiple)) > budget
    assert parameter_breakdown(solved)["total"] == count_parameters(solved)


@pytest.mark.parametrize("fields", [dict(tie_embeddings=False), dict(softmax_components=3, input_embedding_ratio=0.5),
                                    dict(input_embedding_ratio=0.5, num_layers=3)])
@pytest.mark.parametrize("rotary", [False, True])
def test_the_closed_form_counts_the_built_model(fields, rotary):
    config = transformer(hidden=24, heads=2, rotary=rotary, **fields)
    assert count_parameters(config) == count_parameters_by_building(config)


def test_a_width_its_heads_do_not_divide_is_refused_naming_the_fields():
    with pytest.raises(ValueError, match=r"hidden_size: got 18; allowed: a multiple of 8 \(attention_heads 4 times 2 "
                                         r"for rotary positions\) for family 'transformer'"):
        LanguageModel(transformer(hidden=18, heads=4, rotary=True))
    assert LanguageModel(transformer(hidden=12, heads=4, rotary=False)).layers.blocks[0].heads == 4


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=6000, valid_tokens=600, test_tokens=600))


@pytest.mark.parametrize("rotary", [False, True])
def test_learned_and_rotary_positions_train(corpus, rotary):
    config = transformer(hidden=16, heads=2, rotary=rotary, context=10, vocab_size=len(corpus.vocabulary),
                         num_layers=2, input_dropout=0.1, state_dropout=0.1, inter_layer_dropout=0.1,
                         cell_output_dropout=0.1, output_dropout=0.1, embedding_dropout=0.1)
    schedule = Schedule(turns=2, steps_per_turn=25, batch_size=8, bptt=10, eval_batch_size=4)
    result = train(config, TrainingConfig(schedule=schedule, learning_rate=3e-3), corpus, device=CPU)
    first, last = (turn.val_loss for turn in result.turns)
    assert last < first < math.log(len(corpus.vocabulary))  # better than uniform, and getting better


def test_rotary_attention_scores_depend_only_on_relative_positions():
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 1, 1, 8, generator=generator), torch.randn(1, 1, 1, 8, generator=generator)

    def score(query_position: int, key_position: int) -> torch.Tensor:
        return (rotate(query, torch.tensor([query_position])) * rotate(key, torch.tensor([key_position]))).sum()

    torch.testing.assert_close(score(7, 3), score(4, 0))
    torch.testing.assert_close(score(30, 26), score(4, 0))
    assert not torch.allclose(score(7, 3), score(7, 4))
    torch.testing.assert_close(rotate(query, torch.tensor([5])).norm(), query.norm())  # a rotation


def test_windows_are_read_after_the_tokens_before_them_up_to_the_context():
    torch.manual_seed(0)
    model = LanguageModel(transformer(context=6)).eval()
    tokens = torch.randint(13, (15, 2), generator=torch.Generator().manual_seed(0))
    whole, _ = model(tokens[:6], model.initial_state(2))
    first, state = model(tokens[:4], model.initial_state(2))
    assert state[0][0].tolist() == tokens[:4].t().tolist()
    second, state = model(tokens[4:6], state)
    torch.testing.assert_close(torch.cat([first, second]), whole)
    assert state[0][0].shape == (2, 5)  # context - 1 tokens kept
    # a window longer than the context is read in pieces of context tokens, each after as many before it as fit
    long, _ = model(tokens, model.initial_state(2))
    state, one_at_a_time = model.initial_state(2), []
    for step in range(6):
        logits, state = model(tokens[step : step + 1], state)
        one_at_a_time.append(logits)
    torch.testing.assert_close(long[:6], torch.cat(one_at_a_time))
    torch.testing.assert_close(long[6:12], model(tokens[6:12], model.initial_state(2))[0])
    torch.testing.assert_close(long[12:], model(tokens[9:], model.initial_state(2))[0][3:])


def test_dynamic_evaluation_runs_on_a_tiny_transformer_and_learns_a_repeated_segment(corpus):
    torch.manual_seed(0)
    model = LanguageModel(transformer(hidden=16, heads=2, context=10, vocab_size=len(corpus.vocabulary)))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    rms = gradient_rms(model, corpus.train, batch_size=8, bptt=10, max_windows=3)
    frozen = DynamicEvaluationConfig(max_time_steps=10, learning_rate=0.0, decay=0.01)
    static = cross_entropy(model, corpus.valid[:201], 1, 10)
    assert dynamic_cross_entropy(model, corpus.valid[:201], rms, frozen) == pytest.approx(static, rel=1e-6)
    segment = torch.randint(len(corpus.vocabulary), (30,), generator=torch.Generator().manual_seed(1)).repeat(6)
    adapting = DynamicEvaluationConfig(max_time_steps=5, learning_rate=3e-3, decay=1e-3)
    adapted = dynamic_cross_entropy(model, segment, rms, adapting)
    frozen = adapting.model_copy(update={"learning_rate": 0.0})
    assert adapted < dynamic_cross_entropy(model, segment, rms, frozen) - 0.1
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
