"""Flask (functions-framework) requests to ``httpmsg`` values and back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from looprelay.httpmsg import Request, Response, lower_headers

if TYPE_CHECKING:
    import flask


def request_from_flask(request: flask.Request) -> Request:
    """Copy what a handler needs out of a Flask request; the raw body stays bytes for HMAC."""
    return Request(
        method=request.method,
        path=request.path,
        query=request.query_string.decode("latin-1"),
        headers=lower_headers(request.headers.items()),
        body=request.get_data(cache=False),
    )


def response_to_flask(response: Response) -> flask.Response:
    """Turn a handler's response into the Flask response functions-framework returns."""
    import flask

    return flask.Response(
        response.body,
        status=response.status,
        content_type=response.content_type,
        headers=dict(response.headers),
    )
