"""Deployment helpers: TLS/auth material, loopback federations and Ray clusters (see docs/deployment.md)."""
