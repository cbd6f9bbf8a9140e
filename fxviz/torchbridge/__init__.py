"""The torch bridge: what capture (symbolic) and fallback (eager) share to turn a running model into
IR. Torch values into plain data (``values``), frames into source lines (``source``), the model's
inputs and outputs flattened (``normalize``), one spelling of dispatcher ops (``opnames``), whether a
capture holds for real inputs (``checks``), and the bookkeeping around an attempt (``run``).
"""
