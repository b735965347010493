"""Fitting the simulator's constants from measurements (offline tools, never imported by
the engine at run time).

- ``transforms``: fitted constants (``Param``) and their unit-box coordinates, shared by
  every fit here; the optimizer is scipy's bounded least squares.
- ``readers``, ``kernel_fit``, ``errors``, ``tables``: the shipped GPU profiles fitted to
  reference kernel times, their errors, and those errors as Markdown.
- ``measure``, ``machine``, ``step_fit``, ``on_device``: a profile of this machine, fitted
  to the real executor's step times (``slotune calibrate --model``).
- ``from_runs``: a serving stack fitted to measured serving runs
  (``slotune calibrate --from-runs``).
"""
