"""Adam and AdamW over parameters stacked along a first, per-model dimension.

Each row of a stacked tensor is one model's parameter. :class:`StackedAdam` makes the update
``torch.optim.Adam`` (``torch.optim.AdamW``) makes with its defaults on each model's own parameters, with
each model's own learning rate and weight decay, in a few whole-stack operations instead of a handful per
parameter and model. All rows have taken the same number of steps: a pass trains its models from the
same first step and drops a model's rows when it stops (:meth:`StackedAdam.keep_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["AdamSettings", "StackedAdam"]


@dataclass(frozen=True)
class AdamSettings:
    """What differs between the optimizers of a pass's models besides the learning rate."""

    weight_decays: tuple[float, ...]
    decoupled: bool = False  # AdamW
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


def _per_row(values: Sequence[float], like: torch.Tensor) -> torch.Tensor | float:
    """``values`` as a scalar when they are all equal, else a tensor broadcasting over ``like``'s rows."""
    if all(value == values[0] for value in values):
        return float(values[0])
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))


class StackedAdam:
    """Adam state for stacked parameters ``{name: (M, ...)}``; :meth:`step` applies each row's own rates."""

    def __init__(self, params: dict[str, torch.Tensor], settings: AdamSettings) -> None:
        self.params, self.settings = params, settings
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        self.steps = 0

    @torch.no_grad()
    def step(self, learning_rates: Sequence[float]) -> None:
        """One update of every row that has a gradient, with ``learning_rates[i]`` for row ``i``."""
        beta1, beta2 = self.settings.betas
        self.steps += 1
        bias_correction1 = 1 - beta1**self.steps
        bias_correction2_sqrt = (1 - beta2**self.steps) ** 0.5
        step_sizes = [lr / bias_correction1 for lr in learning_rates]
        for name, param in self.params.items():
            grad = param.grad
            if grad is None:
                continue
            grad = self._decayed(param, grad, learning_rates)
            exp_avg, exp_avg_sq = self.exp_avg[name], self.exp_avg_sq[name]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.settings.eps)
            step_size = _per_row(step_sizes, param)
            if isinstance(step_size, float):
                param.addcdiv_(exp_avg, denom, value=-step_size)
            else:
                param.add_(-step_size * exp_avg / denom)

    def _decayed(self, param: torch.Tensor, grad: torch.Tensor, learning_rates: Sequence[float]) -> torch.Tensor:
        """Weight decay: the L2 term added to the gradient (Adam), or the weights shrunk first (AdamW)."""
        decays = self.settings.weight_decays
        if not any(decays):
            return grad
        if self.settings.decoupled:
            param.mul_(_per_row([1 - lr * wd for lr, wd in zip(learning_rates, decays, strict=True)], param))
            return grad
        decay = _per_row(decays, param)
        return grad.add(param, alpha=decay) if isinstance(decay, float) else grad + param * decay

    def keep_rows(self, rows: Sequence[int]) -> dict[str, torch.Tensor]:
        """Keep only ``rows`` (the models still training), as new leaf tensors; returns the new parameters."""
        index = torch.tensor(list(rows), dtype=torch.long)
        self.settings = AdamSettings(
            tuple(self.settings.weight_decays[i] for i in rows),
            self.settings.decoupled,
            self.settings.betas,
            self.settings.eps,
        )

        def kept(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {name: t.detach()[index.to(t.device)].clone() for name, t in tensors.items()}

        self.exp_avg, self.exp_avg_sq = kept(self.exp_avg), kept(self.exp_avg_sq)
        trainable = {name: p.requires_grad for name, p in self.params.items()}
        self.params = {name: t.requires_grad_(trainable[name]) for name, t in kept(self.params).items()}
        return self.params
