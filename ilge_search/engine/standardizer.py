"""Per-(layer, dimension) z-scoring of layer states, fitted on the training set and stored with the model."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FeatureStandardizer"]


class FeatureStandardizer(nn.Module):
    """Per-(layer, dimension) z-scoring with statistics of the training set.

    LLM hidden states carry a few "massive activation" dimensions (SmolLM2's
    early layers reach values in the thousands) that swamp every other
    feature; without standardisation the encoders barely train on them. The
    statistics are buffers, so a saved model applies the same transform.
    Before :meth:`fit` it is the identity.

    Shapes:
        - input: ``(..., num_layers, hidden_in)``
        - output: same shape, float32
    """

    mean: torch.Tensor
    inv_std: torch.Tensor

    def __init__(self, num_layers: int, hidden_in: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.hidden_in = hidden_in
        self.eps = eps
        self.register_buffer("mean", torch.zeros(num_layers, hidden_in))
        self.register_buffer("inv_std", torch.ones(num_layers, hidden_in))

    @torch.no_grad()
    def fit(self, features: torch.Tensor, chunk_size: int = 4096) -> FeatureStandardizer:
        """Set the statistics from ``features`` ``(..., L, D)``, reading it in float64 chunks."""
        flat = features.reshape(-1, self.num_layers, self.hidden_in)  # pairs: both sentences count
        total = torch.zeros(self.num_layers, self.hidden_in, dtype=torch.float64)
        total_sq = torch.zeros_like(total)
        for start in range(0, flat.shape[0], chunk_size):
            chunk = flat[start : start + chunk_size].to(torch.float64).cpu()
            total += chunk.sum(0)
            total_sq += chunk.square().sum(0)
        n = flat.shape[0]
        mean = total / n
        var = (total_sq / n - mean.square()).clamp_min(0.0)
        self.mean.copy_(mean.to(self.mean))
        self.inv_std.copy_((var.sqrt() + self.eps).reciprocal().to(self.inv_std))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != self.mean.shape:
            return x  # let the aggregator report the shape error
        return (x.float() - self.mean) * self.inv_std

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}, hidden_in={self.hidden_in}"
