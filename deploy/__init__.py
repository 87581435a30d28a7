"""Deployment helpers: TLS/auth material, loopback federations, Ray clusters, ``flwr`` CLI wrappers
and ``python -m deploy.launch`` (see docs/deployment.md).

Arrows point one way: ``deploy`` runs and exports the apps, so it may import ``flower_apps`` (lazily,
inside the commands that need it) and ``flower_apps`` never imports ``deploy``
(tests/test_import_graph.py checks it). ``deploy.flwr_cli``, ``certs`` and ``processes`` import no
other project package: the docker images carry ``deploy/`` alone for the compose ``register`` service.
"""
