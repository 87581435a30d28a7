"""Helpers shared by the study apps: results I/O, statistics over seeds, torch glue."""
