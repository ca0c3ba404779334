"""Bundled Jinja2 templates for prompts and comments, shipped as package data."""
