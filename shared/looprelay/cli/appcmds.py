"""``looprelay app create``: register a GitHub App from a manifest, as Probot does, and keep
its credentials in the data directory."""

from __future__ import annotations

from pathlib import Path

import click

from looprelay.cli.common import data_path, load, state_options

DEFAULT_WAIT_SECONDS = 1800


@click.group("app")
def app_group() -> None:
    """The GitHub App looprelay acts as."""


@app_group.command("create")
@state_options
@click.option(
    "--webhook-url",
    required=True,
    help="Where GitHub sends the App's deliveries: your tunnel's URL to /webhook, or the "
    "cloud's webhook function.",
)
@click.option("--org", default=None, help="Register the App for this organization.")
@click.option(
    "--github-url",
    default="https://github.com",
    show_default=True,
    help="GitHub's web URL (GitHub Enterprise Server: https://HOST; its API is then "
    "https://HOST/api/v3).",
)
@click.option("--name", default="looprelay", show_default=True, help="The App's name.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Setup page port [any].")
@click.option(
    "--wait",
    type=click.IntRange(min=1),
    default=DEFAULT_WAIT_SECONDS,
    show_default=True,
    help="Seconds to wait for the click on GitHub.",
)
def app_create(
    config_path: Path | None,
    data_dir: Path | None,
    webhook_url: str,
    org: str | None,
    github_url: str,
    name: str,
    port: int,
    wait: int,
) -> None:
    """Serve a one-page setup on loopback whose button registers a private GitHub App with the
    permissions and events looprelay uses; GitHub's code is exchanged for the App's id, key
    and secrets, which go into the data directory for `looprelay up`."""
    from looprelay.adapters.github.app_registration import convert_code, save_app
    from looprelay.app.app_setup import CALLBACK_PATH, AppSetup, new_apps_url
    from looprelay.app.server import LocalServer, bind_listener
    from looprelay.core.app_manifest import app_manifest
    from looprelay.datadir import WEBHOOK_SECRET_FILE

    config = load(config_path)
    data = data_path(data_dir)
    web = github_url.rstrip("/")
    api_url = "https://api.github.com" if web == "https://github.com" else f"{web}/api/v3"
    listener = bind_listener("127.0.0.1", port)  # the port first: the manifest names it
    host, bound = listener.getsockname()[:2]
    base = f"http://{host}:{bound}"
    try:
        manifest = app_manifest(
            name=name,
            url=webhook_url,
            webhook_url=webhook_url,
            redirect_url=base + CALLBACK_PATH,
            events=config.webhook.allowed_events(),
        )
    except ValueError as exc:
        listener.close()
        raise click.ClickException(f"webhook.events: {exc}") from exc
    secret_file = data / WEBHOOK_SECRET_FILE
    had_secret = secret_file.exists()
    setup = AppSetup(
        manifest=manifest,
        post_to=new_apps_url(web, org),
        convert=lambda code: convert_code(api_url, code),
        save=lambda app: save_app(data, app, api_url=api_url),
    )
    server = LocalServer(setup.app, host=host, port=bound, listener=listener)
    server.start()
    try:
        click.echo(f"Open {base}/ and press 'Register a GitHub App'.", err=True)
        if not setup.done.wait(wait):
            raise click.ClickException(f"no answer from GitHub within {wait} s; nothing saved")
    finally:
        server.stop()
    if setup.outcome.app is None:
        raise click.ClickException(setup.outcome.error or "the App was not created")
    app = setup.outcome.app
    click.echo(f"App created: {app.slug} (id {app.id}), credentials in {data}")
    click.echo(f"Install it on your repositories: {app.install_url}")
    if had_secret:
        click.echo(
            f"{secret_file} now holds the App's webhook secret; a repository webhook that used "
            "the one before needs this one"
        )
    click.echo(f"Then start: looprelay up --data {data}")
