"""The ``fxviz`` command: a thin shell over the public API.

``base`` holds the group (every outcome of a command is decided there) and the options commands
share; each verb module registers its commands on it. Importing this package registers them all.
"""

from __future__ import annotations

import fxviz.cli.compile  # noqa: F401  (registers compile)
import fxviz.cli.graphs  # noqa: F401  (registers tree, json, html, render, diff, demo)
import fxviz.cli.numerics  # noqa: F401  (registers numerics)
import fxviz.cli.passes  # noqa: F401  (registers passes)
from fxviz.cli.base import EXIT_BROKEN_PIPE, EXIT_BUG, EXIT_CODES, EXIT_INTERRUPTED, cli, main, read_graph

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_BUG", "EXIT_CODES", "EXIT_INTERRUPTED", "cli", "main", "read_graph"]
