"""Performance harnesses that print ratios measured in the same run (never timed assertions in tests).

Each harness runs as a script (``python benchmarks/<name>.py``) and offers ``measure(...)``, which
returns rows ``{metric, value, reference, ratio, target, met}``; ``python -m benchmarks`` runs
them all at a quick setting and prints one table (see benchmarks/__main__.py).
"""
