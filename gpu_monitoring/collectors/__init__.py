"""Collectors, one per capability, and the node collector that runs them."""

from .node import COLLECTOR_NAMES, NodeCollector

__all__ = ["COLLECTOR_NAMES", "NodeCollector"]
