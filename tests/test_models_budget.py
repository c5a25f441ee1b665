"""Parameter budgets: the closed-form count, the test vectors of docs/methodology.md#equal-parameter-budgets and
the hidden-size solver."""

import itertools
import subprocess
import sys
from dataclasses import replace

import pytest

from lm_tuner.models import FAMILIES, LanguageModel, ModelConfig, count_parameters, solve_hidden_size

# docs/methodology.md#equal-parameter-budgets: (configuration, budget, hidden size, parameter count).
TEST_VECTORS = [
    (dict(vocab_size=10001, num_layers=1, input_embedding_ratio=0.224374398589), 10_000_000, 1194, 9_997_549),
    (dict(vocab_size=10001, num_layers=4), 24_000_000, 723, 23_979_620),
    (dict(vocab_size=33279, num_layers=2, input_embedding_ratio=0.121501773596), 24_000_000, 1227, 23_982_129),
    (dict(vocab_size=10001, num_layers=2), 24_000_000, 951, 23_998_976),
    (dict(vocab_size=10001, num_layers=2, family="mogrifier", mogrifier_rounds=5, mogrifier_rank=84),
     24_000_000, 912, 23_987_393),
    (dict(vocab_size=206, num_layers=4, tie_embeddings=False), 27_000_000, 911, 26_947_586),
]


@pytest.mark.parametrize(("fields", "budget", "hidden", "count"), TEST_VECTORS)
def test_solver_reproduces_the_methodology_test_vectors(fields, budget, hidden, count):
    solved = solve_hidden_size(ModelConfig(hidden_size=1, **fields), budget)
    assert solved.hidden_size == hidden
    assert count_parameters(solved) == count


def _option_grid(family: str):
    mogrifier = family.startswith("mogrifier")
    for rounds, rank, ratio, tied, residual, components, layers in itertools.product(
        (0, 1, 4) if mogrifier else (0,), (0, 3), (1.5, 0.5), (True, False), (False, True), (1, 3), (1, 3)
    ):
        yield ModelConfig(vocab_size=13, hidden_size=8, family=family, num_layers=layers, input_embedding_ratio=ratio,
                          mogrifier_rounds=rounds, mogrifier_rank=rank, tie_embeddings=tied,
                          residual_connections=residual, softmax_components=components)


@pytest.mark.parametrize("family", FAMILIES)
def test_count_equals_the_built_model_for_every_option(family):
    for config in _option_grid(family):
        built = sum(p.numel() for p in LanguageModel(config).parameters() if p.requires_grad)
        assert count_parameters(config) == built, config


@pytest.mark.parametrize("family", FAMILIES)
def test_solver_returns_the_largest_hidden_size_within_the_budget(family):
    config = ModelConfig(vocab_size=500, hidden_size=1, family=family, input_embedding_ratio=0.6,
                         mogrifier_rounds=3 if family.startswith("mogrifier") else 0, mogrifier_rank=5,
                         softmax_components=2)
    budget = 400_000
    solved = solve_hidden_size(config, budget)
    assert count_parameters(solved) <= budget < count_parameters(replace(solved, hidden_size=solved.hidden_size + 1))


def test_solver_names_the_budget_when_nothing_fits():
    with pytest.raises(ValueError, match="parameter_budget: 1,000 is too small"):
        solve_hidden_size(ModelConfig(vocab_size=10_000, hidden_size=1), 1_000)


def test_a_model_built_for_its_shapes_initialises_nothing_and_leaves_torch_dynamo_unloaded():
    # In a process of its own: this one may have loaded torch._dynamo already. Loading it (and Triton with it) cost
    # tuner plan and every launch 1.5-3 s on 2 cores, and Triton's report of leaks at exit.
    program = (
        "import sys\n"
        "from lm_tuner.models import FAMILIES, ModelConfig\n"
        "from lm_tuner.models.budget import count_parameters_by_building, parameter_breakdown\n"
        "for family in FAMILIES:\n"
        "    rounds = 5 if 'mogrifier' in family else 0\n"
        "    config = ModelConfig(vocab_size=50, hidden_size=16, family=family, num_layers=2,\n"
        "                         mogrifier_rounds=rounds, mogrifier_rank=3, softmax_components=2)\n"
        "    assert parameter_breakdown(config)['total'] == count_parameters_by_building(config) > 0\n"
        "print(sorted(name for name in ('torch._dynamo', 'triton') if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
