"""Study tabular-pdp: anonymization, drift detection and ARIREC-personalized DP on a tabular FL task."""
