"""Importable helpers for tests (functions passed to ``syncscope.testing.spawn`` live here)."""
