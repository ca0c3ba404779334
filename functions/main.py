"""Cloud Functions entry points: each builds its handler once, then hands it the request."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import functions_framework

from looprelay.cloud import (
    build_ingress,
    build_runner_api,
    build_sweeper,
    build_worker,
    cloud_config,
)
from looprelay.flaskmsg import request_from_flask, response_to_flask
from looprelay.logs import configure_logging

if TYPE_CHECKING:
    import flask

    from looprelay.ingress import Ingress
    from looprelay.runnerapi import RunnerApi
    from looprelay.sweeper import SweepHandler
    from looprelay.worker import Worker


@functools.cache
def _ingress() -> Ingress:
    configure_logging()
    return build_ingress(cloud_config(os.environ), os.environ)


@functools.cache
def _worker() -> Worker:
    configure_logging()
    return build_worker(cloud_config(os.environ), os.environ)


@functools.cache
def _runner_api() -> RunnerApi:
    configure_logging()
    return build_runner_api(cloud_config(os.environ), os.environ)


@functools.cache
def _sweeper() -> SweepHandler:
    configure_logging()
    return build_sweeper(cloud_config(os.environ), os.environ)


# Build the deployed target's handler at import, so a misconfigured deployment fails to
# start (and the rollout stops) instead of answering 500 to every delivery.
def _build_deployed_target() -> None:
    target = os.environ.get("FUNCTION_TARGET")
    if target == "webhook":
        _ingress()
    elif target == "worker":
        _worker()
    elif target == "runners":
        _runner_api()
    elif target == "sweeper":
        _sweeper()


_build_deployed_target()


@functions_framework.http
def webhook(request: flask.Request) -> flask.Response:
    """GitHub's deliveries: verify, enqueue, 202."""
    return response_to_flask(_ingress().handle(request_from_flask(request)))


@functions_framework.http
def worker(request: flask.Request) -> flask.Response:
    """Cloud Tasks' target: settle the delivery in the ledger."""
    return response_to_flask(_worker().handle(request_from_flask(request)))


@functions_framework.http
def runners(request: flask.Request) -> flask.Response:
    """Runner agents: register, heartbeat, rotate (``/runner/v1/...``)."""
    return response_to_flask(_runner_api().handle(request_from_flask(request)))


@functions_framework.http
def sweeper(request: flask.Request) -> flask.Response:
    """Cloud Scheduler's target: redeliver failed GitHub deliveries the ledger lacks."""
    return response_to_flask(_sweeper().handle(request_from_flask(request)))
