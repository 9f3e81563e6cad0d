"""Every test docs/reliability.md names exists, and every guarantee on it names one."""

from __future__ import annotations


def test_every_test_the_reliability_page_names_exists(page_names_tests):
    page_names_tests("docs/reliability.md", minimum=25)
