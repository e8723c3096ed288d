"""The metric spec (metrics.yaml) and values in their units."""
