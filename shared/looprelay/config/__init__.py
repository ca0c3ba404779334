"""The configuration: its model, its reference docs, and what it resolves to."""
