"""Factories for the CLI tests, well-behaved and hostile: the tests copy this file next to a
temporary directory and point ``fxviz`` at ``my_model.py:FACTORY``, as a user would."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class ExitsInForward(Net):
    def forward(self, x: torch.Tensor) -> NoReturn:
        sys.exit(4)


class Hostile(Net):
    def forward(self, x: torch.Tensor) -> NoReturn:
        raise ValueError("\x1b]0;PWNED\x07\x1b[2J")  # sets the terminal's title, clears the screen


class Boom(BaseException):
    pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def build() -> Any:
    return Net(), (torch.randn(2, 4),)


def bare() -> Any:
    return Net()


def kw() -> Any:
    return Net(), (), {"x": torch.randn(5, 4)}


def broken() -> NoReturn:
    raise ValueError("no config file found")


def not_a_model() -> Any:
    return {"model": 1}


def exits() -> NoReturn:
    sys.exit(3)


def boom() -> NoReturn:
    raise Boom("the factory gave up")


def exits_in_forward() -> Any:
    return ExitsInForward(), (torch.randn(2, 4),)


def hostile() -> Any:
    return Hostile(), (torch.randn(2, 4),)


def two_lines() -> NoReturn:
    raise ValueError("first line\nsecond line")


def interrupted() -> NoReturn:
    raise KeyboardInterrupt


def unprintable() -> NoReturn:
    raise Unprintable()


def only_linear() -> Any:
    """A model without inputs: ``--input-shape`` must give ``(*, 10)``."""
    return nn.Sequential(nn.Linear(10, 4), nn.ReLU())


def only_conv() -> Any:
    """A model without inputs: ``--input-shape`` must give ``(N, 3, H, W)``."""
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())


def only_embedding() -> Any:
    """A model without inputs: ``--input-shape`` must come with ``--dtype int64``."""
    return nn.Sequential(nn.Embedding(20, 4), nn.Linear(4, 2))
