"""The torch bridge: what capture (symbolic) and fallback (eager) share to turn a running model into
IR. Torch values into plain data (``values``), frames into source lines (``source``), the model's
inputs and outputs flattened (``normalize``), one spelling of dispatcher ops (``opnames``), whether a
capture holds for real inputs (``checks``), and the bookkeeping around an attempt (``run``).
"""

import warnings

import torch

#: The torch release fxviz is tested with (CI) and declares (``pyproject.toml``). torch 2.11 ran the
#: GPU tests but gave other answers in ~50 of the suite's tests (README, "Which torch").
TESTED = (2, 13)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


if _release(torch.__version__) < TESTED:
    warnings.warn(f"fxviz is tested with torch {TESTED[0]}.{TESTED[1]}; this is torch {torch.__version__}, where "
                  "some of its answers differ (README, \"Which torch\"): pip install 'torch>=2.13'", stacklevel=2)
