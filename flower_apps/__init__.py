"""Flower ServerApp/ClientApp pairs, one subpackage per study, and the root router."""
