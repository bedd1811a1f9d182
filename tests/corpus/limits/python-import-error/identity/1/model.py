"""Fails when Triton imports it."""

raise ImportError("a package the model needs is missing")
