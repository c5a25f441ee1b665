"""The GRU and Mogrifier GRU families' layers and model (docs/methodology.md#gru-and-mogrifier-gru).

A layer runs PyTorch's fused `nn.GRU` over the whole window where nothing needs the single step: no state dropout
and no mogrifier. Otherwise it loops over time under autograd, one `GRUCell.step` per token: state dropout
(Gal & Ghahramani, 2016) drops h where the recurrent matrices read it, and a mogrifier (Melis, Kocisky & Blunsom,
2020, section 7) first lets x and the dropped-out h gate each other for its rounds, then the gates read the
mogrified pair. In both cases the update interpolates between the candidate and the state itself, untouched, as
the Mogrifier LSTM leaves its memory c untouched: a mogrified h (gated by up to 2 per round) carried into the next
step would lose the GRU's bound |h| <= 1.

The state of a layer is the 1-tuple (h,) where the LSTM families carry (h, c); everything that handles states
(`detach_state`, evaluation, checkpoints) treats a layer's state as a tuple of tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lm_tuner.models.config import ModelConfig
from lm_tuner.models.gru_cell import GRUCell
from lm_tuner.models.language_model import LanguageModel
from lm_tuner.models.mogrifier import Mogrifier
from lm_tuner.models.tape import autograd_linear

GRUState = tuple[Tensor]
"""(h,) of one layer, h (batch, hidden)."""


class GRULayer(nn.Module):
    """A GRU, preceded by its own mogrifier when the configuration has rounds. `fast` False runs the cell loop even
    where the fused `nn.GRU` could (the two compute the same numbers)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        input_size, hidden = config.layer_input_size(layer), config.hidden_size
        self.cell = GRUCell(input_size, hidden, chrono_t_max=config.chrono_t_max)
        self.mogrifier = None
        if config.mogrifier_rounds > 0:
            self.mogrifier = Mogrifier(input_size, hidden, config.mogrifier_rounds, config.mogrifier_rank)
        self.fast = True

    def forward(self, inputs: Tensor, state: GRUState, state_mask: Tensor | None = None) -> tuple[Tensor, GRUState]:
        """Outputs h for every step (time, batch, hidden) and the last state (h,)."""
        (h,) = state
        if self.fast and self.mogrifier is None and state_mask is None:
            outputs, h_last = self.cell(inputs, h.unsqueeze(0).contiguous())
            return outputs, (h_last.squeeze(0),)
        x_parts = self.cell.input_part(inputs) if self.mogrifier is None else None  # stateless: whole window
        outputs = []
        for t in range(inputs.shape[0]):
            h_seen = h if state_mask is None else h * state_mask
            if self.mogrifier is None:
                x_part = x_parts[t]
            else:
                x, h_seen, _ = self.mogrifier(autograd_linear, inputs[t], h_seen)
                x_part = self.cell.input_part(x)
            h = self.cell.step(x_part, h_seen, h)
            outputs.append(h)
        return torch.stack(outputs), (h,)


class GRULanguageModel(LanguageModel):
    """`LanguageModel` with GRU layers; `LanguageModel(config)` builds it for the GRU families."""

    def _recurrent_layers(self) -> list[GRULayer]:
        return [GRULayer(self.config, layer) for layer in range(self.config.num_layers)]

    def initial_state(self, batch_size: int) -> list[GRUState]:
        device = self.output_bias.device
        return [(torch.zeros(batch_size, layer.cell.hidden_size, device=device),) for layer in self.layers]
