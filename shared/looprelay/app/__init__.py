"""The one ASGI application (``asgi``), built from configuration (``compose``), and
the server of ``looprelay up`` (``server``)."""
