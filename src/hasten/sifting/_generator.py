"""The sifting generator of :class:`~hasten.sifting.SiftingDataloader`: seeded once, made on the
scoring device at the first scored batch, its state carried through checkpoints."""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["SiftGenerator"]


class SiftGenerator:
    """Args: ``seed`` (default ``torch.initial_seed()``, read now) or a ready ``generator``.

    Attributes:
        seed: The seed a made generator starts from.
        generator: The generator (``None`` until :meth:`on` made it, unless one was given).
    """

    def __init__(self, seed: int | None, generator: torch.Generator | None) -> None:
        self.seed = int(torch.initial_seed() if seed is None else seed) % (2**63)
        self.generator = generator
        self._pending: dict[str, Any] | None = None  # a checkpoint's state, not applied yet

    def on(self, device: torch.device) -> torch.Generator:
        """The generator, made on ``device`` at the first call (seeded, a checkpoint's state
        applied)."""
        gen = self.generator
        if gen is None:
            gen = self.generator = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self._apply(device)
        elif gen.device.type != device.type:
            raise ValueError(
                f"the sifting generator is on {gen.device} but losses are on {device}; pass "
                f"generator=torch.Generator(device='{device.type}') or a seed instead"
            )
        return gen

    def state_dict(self) -> dict[str, Any] | None:
        """The generator's device and state (``None`` before the first scored batch)."""
        gen = self.generator
        return None if gen is None else {"device": gen.device.type, "state": gen.get_state()}

    def load(self, seed: int, saved: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict` output (applied now, or when the generator is made)."""
        self.seed = seed
        self._pending = saved
        if self.generator is not None:
            self._apply(self.generator.device)

    def _apply(self, device: torch.device) -> None:
        saved = self._pending
        if saved is None or self.generator is None:
            return
        self._pending = None
        if saved["device"] == device.type:
            self.generator.set_state(saved["state"])
        else:
            warnings.warn(
                f"the checkpoint's sifting generator ran on {saved['device']}, this run scores on "
                f"{device.type}: the generator is re-seeded, so kept samples will differ from an "
                "uninterrupted run",
                stacklevel=4,
            )
