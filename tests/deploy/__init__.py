"""Helpers for the deploy/ checks (Kubernetes manifests and the image)."""
