"""Adapters: one module per technology per port; they move bytes and translate errors."""
