"""Data-quality rules, Great Expectations suites and the asset checks built from them."""
