"""PPO critic: a value model of the policy's architecture with a scalar head.

The backbone is loaded from the same checkpoint as the policy (so it starts from the policy's
representation, as in Ouyang et al. 2022); the head is a zero-initialized linear layer, so
initial values are 0. Values are read at the columns that predict each response token, i.e.
V(s_t) for the state before token t is generated.
"""

from __future__ import annotations

import torch
from torch import nn

from rlbatch.backends.builtin.batch import SeqBatch, response_hidden_slice


class ValueModel(nn.Module):
    def __init__(self, causal_lm):
        super().__init__()
        self.backbone = causal_lm.model  # the decoder without its LM head
        hidden = causal_lm.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, b: SeqBatch) -> torch.Tensor:
        """(N, L) values of the states before each response token."""
        width = b.prompt_width + b.response_ids.shape[1] - 1
        out = self.backbone(input_ids=b.input_ids[:, :width],
                            attention_mask=b.attention_mask[:, :width],
                            position_ids=b.position_ids[:, :width], use_cache=False)
        h = out.last_hidden_state[:, response_hidden_slice(b)]  # (N, L, E)
        return self.head(h).squeeze(-1).float()
