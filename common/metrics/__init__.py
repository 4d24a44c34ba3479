"""Prometheus metrics of a node: the HTTP exporter and what every server counts (docs/metrics.md)."""
