"""The behaviour every layer encoder must have, as a reusable pytest class.

Usage::

    from ilge_search.testing import LayerEncoderContract

    class TestCayleyGAT(LayerEncoderContract):
        def make_config(self):
            return CayleyConfig(conv_type="gat", gat_heads=2, hidden_dim=16)

The class has no ``Test`` prefix, so pytest collects only the subclasses. Each
check builds the encoder through :func:`ilge_search.build_aggregator`, so the
public wrapper (input checks, dtype casting) is covered too. Checks that need
learnable parameters skip for parameter-free encoders (e.g. last-layer).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..encoders.aggregator import build_aggregator
from ..encoders.configs import EncoderConfig
from ..nn import LayerEncoder


class LayerEncoderContract:
    """Subclass and implement :meth:`make_config`; override the sizes if needed."""

    num_layers: int = 7
    hidden_in: int = 12
    batch_size: int = 5

    def make_config(self) -> EncoderConfig:
        raise NotImplementedError

    def make_aggregator(self, num_layers: int | None = None, hidden_in: int | None = None):

        return build_aggregator(self.make_config(), num_layers or self.num_layers, hidden_in or self.hidden_in)

    def make_input(self, batch_size: int | None = None, seed: int = 0) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size or self.batch_size, self.num_layers, self.hidden_in, generator=generator)

    # --- the contract -------------------------------------------------------------------------------

    def test_output_shape_and_out_dim(self) -> None:

        agg = self.make_aggregator()
        assert isinstance(agg.encoder, LayerEncoder)
        assert isinstance(agg.out_dim, int) and agg.out_dim > 0
        assert (agg.num_layers, agg.hidden_in) == (self.num_layers, self.hidden_in)
        assert agg.config == self.make_config()
        out = agg(self.make_input())
        assert out.shape == (self.batch_size, agg.out_dim)
        assert out.dtype == torch.float32
        assert torch.isfinite(out).all()

    def test_gradients_reach_every_parameter(self) -> None:
        torch.manual_seed(0)
        agg = self.make_aggregator()
        params = dict(agg.named_parameters())
        if not params:
            pytest.skip("encoder has no learnable parameters")
        agg.train()
        x = self.make_input(batch_size=16)
        # a random projection of the output, so no parameter's gradient cancels by symmetry
        target = torch.randn(agg.out_dim, generator=torch.Generator().manual_seed(1))
        (agg(x) @ target).sum().backward()
        missing = [name for name, p in params.items() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, f"no gradient reached {missing}"

    def test_eval_batch_independence(self) -> None:
        agg = self.make_aggregator().eval()
        x = self.make_input(batch_size=6)
        with torch.no_grad():
            full = agg(x)
            singles = torch.cat([agg(x[i : i + 1]) for i in range(len(x))])
            shuffled = agg(x.flip(0)).flip(0)
            other = agg(torch.cat([x[:2], torch.randn(3, *x.shape[1:])]))[:2]
        torch.testing.assert_close(singles, full, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(shuffled, full, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(other, full[:2], rtol=1e-4, atol=1e-5)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
    def test_accepts_half_and_float_inputs(self, dtype: torch.dtype) -> None:
        agg = self.make_aggregator().eval()
        x = self.make_input()
        with torch.no_grad():
            reference = agg(x.to(dtype).float())
            out = agg(x.to(dtype))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, reference)

    def test_rejects_bad_input(self) -> None:
        agg = self.make_aggregator()
        L, D = self.num_layers, self.hidden_in
        bad = [torch.randn(3, L + 1, D), torch.randn(3, L, D + 1), torch.randn(L, D), torch.randn(2, 3, L, D)]
        for x in bad:
            with pytest.raises(ValueError, match=rf"expected input of shape \(N, {L}, {D}\).*got"):
                agg(x)
        with pytest.raises(ValueError, match="float32"):
            agg(torch.ones(3, L, D, dtype=torch.int64))

    def test_reset_parameters(self) -> None:
        agg = self.make_aggregator()
        if not list(agg.parameters()):
            pytest.skip("encoder has no learnable parameters")
        with torch.no_grad():  # move every weight away from any initial value, constant ones included
            for p in agg.parameters():
                p.add_(torch.rand_like(p) + 1.0)
        scrambled = copy.deepcopy(agg.state_dict())
        torch.manual_seed(123)
        agg.reset_parameters()
        first = copy.deepcopy(agg.state_dict())
        torch.manual_seed(123)
        agg.reset_parameters()
        second = agg.state_dict()
        assert all(torch.equal(first[k], second[k]) for k in first), "reset_parameters is not seed-deterministic"
        unchanged = [name for name, _ in agg.named_parameters() if torch.equal(first[name], scrambled[name])]
        assert not unchanged, f"reset_parameters did not re-initialise {unchanged}"

    def test_deepcopy_and_state_dict_round_trip(self) -> None:
        agg = self.make_aggregator().eval()
        x = self.make_input()
        with torch.no_grad():
            expected = agg(x)
            clone = copy.deepcopy(agg)
            fresh = self.make_aggregator().eval()
            fresh.load_state_dict(agg.state_dict())
            torch.testing.assert_close(clone(x), expected)
            torch.testing.assert_close(fresh(x), expected)

    def test_repr(self) -> None:
        agg = self.make_aggregator()
        text = repr(agg)
        assert text.startswith("Aggregator(") and type(agg.encoder).__name__ in text
        assert "\n" not in repr(agg.encoder)
