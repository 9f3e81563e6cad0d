"""Test helpers shipped with the package, in the style of ``optuna.testing``.

:class:`LayerEncoderContract` is the contract every layer encoder family
passes; subclass it in a test module and implement ``make_config``.
"""

from .encoder_contract import LayerEncoderContract

__all__ = ["LayerEncoderContract"]
