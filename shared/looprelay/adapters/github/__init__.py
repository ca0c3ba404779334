"""GitHub's REST API: comments, reactions, App deliveries, and authentication."""
