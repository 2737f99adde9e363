"""Small facts about ``nn.Module`` objects that several parts of hasten need."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["module_device"]


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter, else of its first buffer, else the CPU."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")
