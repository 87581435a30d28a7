"""Plumbing shared by the study apps, one module per concern.

results (atomic files), stats (seeds: mean, SD, t-interval), tables (CSV + Markdown), plots
(figures), local_training (a client's loop), sweep (a sweep's command), logs (console logging of
simulations), torch_utils (state dicts, device). Seeds and random streams: ``registry.streams``.
"""
