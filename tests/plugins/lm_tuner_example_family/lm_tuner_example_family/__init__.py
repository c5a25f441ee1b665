"""An LSTM language model whose layers' outputs are layer-normalised (Ba, Kiros & Hinton, 2016, Layer
Normalization, arXiv:1607.06450), registered with lm-tuner as the family `lstm_layer_norm` by an entry point.

Each layer's output goes through a LayerNorm before the layer above and the softmax read it; the state the layer
carries to the next step is not normalised. It has no closed-form parameter count: the budget solver counts a
model built on the meta device.
"""

from __future__ import annotations

from torch import Tensor, nn

from lm_tuner.models import Family, Hyperparameter, LanguageModel, ModelConfig
from lm_tuner.models.recurrence import RecurrentLayer, State

NAME = "lstm_layer_norm"

LAYER_NORM_EPSILON = Hyperparameter("layer_norm_epsilon", "model", "float",
                                    "added to the variance in each layer's output LayerNorm", 0.0, 0.1,
                                    low_open=True)


class LayerNormalisedLayer(RecurrentLayer):
    """A `RecurrentLayer` whose outputs go through a LayerNorm (its gain and bias are trainable)."""

    def __init__(self, config: ModelConfig, layer: int, epsilon: float) -> None:
        super().__init__(config, layer)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=epsilon)

    def forward(self, inputs: Tensor, state: State, state_mask: Tensor | None = None) -> tuple[Tensor, State]:
        outputs, state = super().forward(inputs, state, state_mask)
        return self.output_norm(outputs), state


class LayerNormalisedLanguageModel(LanguageModel):
    """`LanguageModel` with `LayerNormalisedLayer`s; `LanguageModel(config)` builds it for this family."""

    def _recurrent_layers(self) -> list[RecurrentLayer]:
        epsilon = self.config.option(LAYER_NORM_EPSILON.name)  # the study's value, else the default
        return [LayerNormalisedLayer(self.config, layer, epsilon) for layer in range(self.config.num_layers)]


def _model() -> type[LanguageModel]:
    return LayerNormalisedLanguageModel


LSTM_LAYER_NORM = Family(
    NAME, cell="lstm", mogrifier=False, residual=False,
    paper="Ba, Kiros & Hinton (2016), Layer Normalization, arXiv:1607.06450",
    description="the LSTM with each layer's output layer-normalised",
    hyperparameters=(LAYER_NORM_EPSILON,), defaults={LAYER_NORM_EPSILON.name: 1e-5},
    model=_model,
)
