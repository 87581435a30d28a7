"""Ultrasound study: federated learning with DP-SGD for breast-ultrasound classification."""
