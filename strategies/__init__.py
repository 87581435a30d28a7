"""Flower Message-API strategies for the studies (registry in strategies.registry)."""
