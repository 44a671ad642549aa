"""Data-quality rules, Great Expectations suites and the asset checks built from them.

``rules.py`` is the data plane's side: the flow spec (``pipelines/spec/``) imports it to validate
named rules, and it imports nothing of ``pipelines``. The other modules are the control plane's
side (Dagster checks, GX suites): they import ``pipelines``, and ``pipelines`` never imports them.
"""
