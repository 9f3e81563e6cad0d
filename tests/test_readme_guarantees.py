"""Every test the Guarantees page (docs/guarantees.md) names exists, so no guarantee points at nothing."""

from __future__ import annotations


def test_every_named_test_exists_and_every_guarantee_names_one(page_names_tests):
    page_names_tests("docs/guarantees.md", minimum=40, markers=("tests/", "::"))
