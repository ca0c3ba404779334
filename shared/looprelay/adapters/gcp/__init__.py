"""Google Cloud's other services: Cloud Tasks and OIDC tokens."""
