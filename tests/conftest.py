"""Settings for the whole suite.

Hypothesis: in CI (``CI`` set, as ``.ci/run`` does) the property tests are derandomized, so a
run is reproducible and a failure is the code's, not the draw's; locally they explore new
examples each run (and keep failing ones in ``.hypothesis/``). ``HYPOTHESIS_PROFILE`` picks
a profile by name.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)
