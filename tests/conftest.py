"""Shared pytest configuration.

Hypothesis runs derandomized by default (profile `ci`): `make test` and CI explore the same examples on
every run, so a red build is the change's doing, not a new draw. `make fuzz` runs the property tests with
fresh random examples (profile `fuzz`, more of them) to look for new failures.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
settings.register_profile("fuzz", derandomize=False, max_examples=2_000)
settings.load_profile(os.environ.get("TOPOGUARD_HYPOTHESIS_PROFILE", "ci"))
