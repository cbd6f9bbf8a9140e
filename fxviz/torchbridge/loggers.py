"""Torch's loggers, as every capture quiets and puts them back (:func:`fxviz.torchbridge.run.quiet_torch`,
:class:`fxviz.torchbridge.guard.ProcessState`), found without a Python loop over every logger of the
process on each capture.

The logging registry holds every logger the process made (about 400 once transformers is
imported, half of them torch's); filtering it by name in Python twice per capture, and clearing
the cache of every logger after each change of level, cost ~0.9 M instructions per capture of
GPT-2's ops (1.5% of the tracer's cost beyond the forward on gpt2-narrow). The list of torch's loggers is kept while the registry holds the same objects in the same
order (compared in C: a new logger, or a placeholder turned into a logger, makes it again).
"""

from __future__ import annotations

import logging
import operator
from collections import deque
from itertools import compress

#: the registry's values the lists below were made from; the name and the logger of each ``torch``
#: and ``torch.*`` logger, in the registry's order
_KEPT: tuple[list[object], list[str], list[logging.Logger]] = ([], [], [])

_level = operator.attrgetter("level")
_disabled = operator.attrgetter("disabled")
_propagate = operator.attrgetter("propagate")
_cache = operator.attrgetter("_cache")


def torch_loggers() -> tuple[list[str], list[logging.Logger]]:
    """The names and the loggers named ``torch`` or ``torch.*`` (placeholders left out), in the
    order of ``logging.Logger.manager.loggerDict``."""
    global _KEPT
    registry = logging.Logger.manager.loggerDict
    values: list[object] = list(registry.values())
    kept = _KEPT
    if len(values) != len(kept[0]) or not all(map(operator.is_, values, kept[0])):
        found = [(name, lg) for name, lg in list(registry.items())
                 if (name == "torch" or name.startswith("torch.")) and isinstance(lg, logging.Logger)]
        kept = _KEPT = (values, [name for name, _ in found], [lg for _, lg in found])
    return kept[1], kept[2]


def with_levels(loggers: list[logging.Logger]) -> list[logging.Logger]:
    """Those of ``loggers`` with a level of their own (not ``NOTSET``)."""
    return list(compress(loggers, map(_level, loggers)))


def states(loggers: list[logging.Logger]) -> tuple[list[int], list[bool], list[bool]]:
    """Each logger's level, ``disabled`` and ``propagate``."""
    return list(map(_level, loggers)), list(map(_disabled, loggers)), list(map(_propagate, loggers))


def clear_torch_caches() -> None:
    """Forget what torch's loggers cached of their levels, after a level of one changed: a logger's
    cache depends on its own level and its parents', and only loggers named ``torch.*`` have
    ``torch`` or a ``torch.*`` logger among their parents (``logging.Logger.manager._clear_cache``
    clears every logger of the process). Loggers made since the last call are found again."""
    deque(map(dict.clear, map(_cache, torch_loggers()[1])), maxlen=0)


__all__ = ["clear_torch_caches", "states", "torch_loggers", "with_levels"]
