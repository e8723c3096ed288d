"""Reads over the network that end by a deadline and stop at a size bound."""
