"""The fast path (hand-written backward through time) against the reference (autograd) path, and gradcheck.

Tolerances: in float64 both paths agree to 1e-10 (only the summation order of the weight gradients
differs). In float32 the fast path multiplies with oneDNN and the reference with MKL, so results
differ by rounding: outputs within 1e-5 and gradients within 1e-4 (relative) + 1e-5 (absolute).
"""

import itertools

import pytest
import torch
from torch.func import functional_call

from lm_tuner.models import FAMILIES, LanguageModel, ModelConfig, tape
from lm_tuner.models import family as registered_family
from lm_tuner.models.gru import GRULayer
from lm_tuner.models.recurrence import RecurrentLayer, variational_mask

RECURRENT = tuple(name for name in FAMILIES if registered_family(name).cell != "transformer")  # those with a fast path


def _layer_variants():
    variants = []
    for family in RECURRENT:
        round_counts = (1, 4) if family.startswith("mogrifier") else (0,)
        for rounds, rank, cap, masked in itertools.product(round_counts, (0, 2), (True, False), (False, True)):
            if rank and not rounds:
                continue
            variants.append(pytest.param(family, rounds, rank, cap, masked,
                                         id=f"{family}-r{rounds}-k{rank}-cap{cap}-mask{masked}"))
    return variants


def layer_of(family, rounds, rank, cap, input_size, hidden, dtype):
    """The first layer of a model whose embedding size is `input_size` (at most `hidden`)."""
    config = ModelConfig(vocab_size=10, hidden_size=hidden, family=family, mogrifier_rounds=rounds,
                         mogrifier_rank=rank, cap_input_gate=cap, input_embedding_ratio=input_size / hidden)
    return (GRULayer if config.cell == "gru" else RecurrentLayer)(config, 0).to(dtype)


def state_of(layer, h, c):
    """The layer's state: (h,) for a GRU (the fast path is then the fused nn.GRU), else (h, c)."""
    return (h,) if isinstance(layer, GRULayer) else (h, c)


def window_of(steps, batch, input_size, hidden, dtype, masked):
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(steps, batch, input_size, dtype=dtype, generator=generator)
    h = torch.randn(batch, hidden, dtype=dtype, generator=generator)
    c = (0.5 * torch.randn(batch, hidden, dtype=dtype, generator=generator)).clamp(-1, 1)
    mask = variational_mask(batch, hidden, 0.3, inputs) if masked else None
    return inputs, h, c, mask


def counting_calls(monkeypatch, owner: object, names: tuple[str, ...] = ("forward", "backward")) -> list[str]:
    """Wraps `owner`'s methods or functions `names` so that each call appends its name to the returned list."""
    calls: list[str] = []
    for name in names:
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name,
                            lambda *args, name=name, original=original: (calls.append(name), original(*args))[1])
    return calls


def outputs_and_grads(layer, fast, inputs, h, c, mask):
    layer.fast = fast
    inputs, *state = (t.detach().requires_grad_() for t in (inputs, *state_of(layer, h, c)))
    outputs, last_state = layer(inputs, tuple(state), mask)
    weights = torch.linspace(-1, 1, outputs.numel(), dtype=outputs.dtype, device=outputs.device).view_as(outputs)
    loss = (outputs * weights).sum() + sum(k * t.sum() for k, t in zip((0.3, 0.7), last_state, strict=False))
    grads = torch.autograd.grad(loss, [inputs, *state, *layer.parameters()])
    return [outputs, *last_state, *grads]


@pytest.mark.parametrize(("family", "rounds", "rank", "cap", "masked"), _layer_variants())
def test_fast_path_matches_reference_in_double_precision(family, rounds, rank, cap, masked):
    torch.manual_seed(0)
    layer = layer_of(family, rounds, rank, cap, input_size=5, hidden=6, dtype=torch.float64)
    window = window_of(7, 3, 5, 6, torch.float64, masked)
    fast, reference = (outputs_and_grads(layer, fast, *window) for fast in (True, False))
    for a, b in zip(fast, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("family", "rounds", "rank", "cap", "masked"), _layer_variants())
def test_fast_path_matches_reference_on_cuda(family, rounds, rank, cap, masked):
    """The same equivalence on a GPU, where the fast path's kernels are cuBLAS and CUDA element-wise ones."""
    torch.manual_seed(0)
    layer = layer_of(family, rounds, rank, cap, input_size=5, hidden=6, dtype=torch.float64).cuda()
    window = [None if t is None else t.cuda() for t in window_of(7, 3, 5, 6, torch.float64, masked)]
    fast, reference = (outputs_and_grads(layer, fast, *window) for fast in (True, False))
    for a, b in zip(fast, reference, strict=True):
        assert a.is_cuda
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("prefer_mkl", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("family", RECURRENT)
def test_fast_path_matches_reference_in_single_precision(family, batch, prefer_mkl, monkeypatch):
    """Large enough (4H x H >= 65536) that the fast path takes its oneDNN kernels on CPU at batch 8;
    at batch 1 (evaluation) it multiplies by the weights directly. The backward's products go through
    MKL on Intel CPUs and oneDNN elsewhere, and so do the forward's over a window (here: 48 rows): both ways
    are checked whatever this machine's CPU."""
    monkeypatch.setattr(tape, "_PREFER_MKL", prefer_mkl)
    monkeypatch.setattr(tape, "_MKL_MIN_ROWS", 6 * 8)
    torch.manual_seed(0)
    rounds = 3 if family.startswith("mogrifier") else 0
    layer = layer_of(family, rounds, 16, True, input_size=128, hidden=128, dtype=torch.float32)
    window = window_of(6, batch, 128, 128, torch.float32, masked=True)
    fast, reference = (outputs_and_grads(layer, fast, *window) for fast in (True, False))
    values = 1 + len(state_of(layer, None, None))  # outputs and the last state; then gradients
    for index, (a, b) in enumerate(zip(fast, reference, strict=True)):
        if index < values:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("family", "rounds", "rank", "cap", "masked"), _layer_variants())
def test_gradcheck_fast_layer(family, rounds, rank, cap, masked):
    torch.manual_seed(0)
    layer = layer_of(family, rounds, rank, cap, input_size=2, hidden=3, dtype=torch.float64)
    inputs, h, c, mask = window_of(3, 2, 2, 3, torch.float64, masked)
    names, state = [name for name, _ in layer.named_parameters()], state_of(layer, h, c)

    def run(inputs, *state_and_parameters):
        state, parameters = state_and_parameters[: -len(names)], state_and_parameters[-len(names) :]
        outputs, state = functional_call(layer, dict(zip(names, parameters, strict=True)), (inputs, state, mask))
        return outputs, *state

    arguments = [t.requires_grad_() for t in (inputs, *state, *(p.detach().clone() for p in layer.parameters()))]
    assert torch.autograd.gradcheck(run, arguments)


def _tiny_model_configs():
    common = dict(vocab_size=5, hidden_size=3, num_layers=2)
    configs = [pytest.param(ModelConfig(family=family, mogrifier_rounds=2 if family.startswith("mogrifier") else 0,
                                        mogrifier_rank=1, **common), id=family) for family in RECURRENT]
    return [
        *configs,
        pytest.param(ModelConfig(family="mogrifier", mogrifier_rounds=3, input_embedding_ratio=0.7,
                                 tie_embeddings=False, **common), id="projection-untied"),
        pytest.param(ModelConfig(family="rlstm", softmax_components=2, input_embedding_ratio=0.7,
                                 residual_connections=True, **{**common, "num_layers": 3}), id="mixture-residual"),
    ]


@pytest.mark.parametrize("config", _tiny_model_configs())
def test_gradcheck_language_model(config):
    torch.manual_seed(0)
    model = LanguageModel(config).double().eval()
    tokens = torch.randint(config.vocab_size, (3, 2), generator=torch.Generator().manual_seed(0))
    state = [tuple(0.1 * torch.randn(2, config.hidden_size, dtype=torch.float64) for _ in layer_state)
             for layer_state in model.initial_state(2)]
    names = [name for name, _ in model.named_parameters()]

    def logits(*parameters):
        return functional_call(model, dict(zip(names, parameters, strict=True)), (tokens, state))[0]

    parameters = [p.detach().clone().requires_grad_() for p in model.parameters()]
    assert torch.autograd.gradcheck(logits, parameters)


def _autograd_nodes(tensor):
    seen, frontier = set(), [tensor.grad_fn]
    while frontier:
        node = frontier.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        frontier.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


def test_the_fast_path_is_selected_by_default():
    model = LanguageModel(ModelConfig(vocab_size=11, hidden_size=4, family="mogrifier", mogrifier_rounds=2))
    logits, _ = model(torch.zeros(3, 2, dtype=torch.long), model.initial_state(2))
    nodes = _autograd_nodes(logits)
    assert "_FastWindowBackward" in nodes
    assert not any(name.startswith(("SigmoidBackward", "TanhBackward")) for name in nodes)


def test_torch_func_transforms_fall_back_to_the_reference_path():
    model = LanguageModel(ModelConfig(vocab_size=11, hidden_size=4, family="mogrifier_rlstm", mogrifier_rounds=2))
    tokens, state = torch.randint(11, (3, 2), generator=torch.Generator().manual_seed(0)), model.initial_state(2)
    parameters = {name: p.detach() for name, p in model.named_parameters()}
    grads = torch.func.grad(lambda p: functional_call(model, p, (tokens, state))[0].sum())(parameters)
    model(tokens, state)[0].sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", RECURRENT)
def test_fast_path_without_gradients_matches_the_recorded_forward(family):
    torch.manual_seed(0)
    rounds = 2 if family.startswith("mogrifier") else 0
    layer = layer_of(family, rounds, 0, True, input_size=4, hidden=4, dtype=torch.float32)
    inputs, h, c, mask = window_of(5, 3, 4, 4, torch.float32, masked=True)
    outputs, state = layer(inputs, state_of(layer, h, c), mask)
    with torch.no_grad():
        outputs_no_grad, state_no_grad = layer(inputs, state_of(layer, h, c), mask)
    assert torch.equal(outputs, outputs_no_grad)
    assert all(torch.equal(a, b) for a, b in zip(state, state_no_grad, strict=True))
