"""``smart_sifting.loss.abstract_sift_loss_module``: see :mod:`hasten.sifting.loss`."""

from __future__ import annotations

from hasten.sifting.loss import Loss

__all__ = ["Loss"]
