"""Tests that need no store: paths and modes, the wait-for graph, redaction, process identity, the import graph."""
