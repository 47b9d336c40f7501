"""`relaxctl webhooks`: the team's webhook endpoints and their delivery log (docs/reference/webhooks.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from client import commands as cmd
from client.commands import Table, api_call
from client.display import Col
from client.sdk import RelaxClient

webhooks_app = typer.Typer(
    help="URLs that receive your team's job events, signed as Standard Webhooks specifies.",
    no_args_is_help=True,
)


@webhooks_app.command("create")
@api_call("json")
def webhooks_create(
    c: RelaxClient,
    endpoint: Annotated[
        str, typer.Argument(metavar="URL", help="An http:// or https:// URL that accepts POST.")
    ],
    event: Annotated[
        list[str] | None,
        typer.Option(help="An event type (job.succeeded) or group (job.*); repeat it. Default: every type."),
    ] = None,
    description: Annotated[str | None, typer.Option(help="A note for your team.")] = None,
    team: Annotated[str | None, typer.Option(help="Admins: the team (name or id).")] = None,
    *,
    as_json: bool = False,
) -> None:
    """Register URL; prints the signing secret, which is shown this once."""
    w = c.create_webhook(endpoint, event_types=event or None, description=description, team=team)
    if as_json:
        cmd.print_json(w)
        return
    cmd.out.print(f"{w['id']}  {w['url']}  ({', '.join(w['event_types'] or ['every event'])})")
    cmd.out.print(f"secret: {w['secret']}", highlight=False)
    cmd.err.print("keep the secret: it verifies each message's webhook-signature and is not shown again")


@webhooks_app.command("list")
@api_call("json")
def webhooks_list(
    c: RelaxClient,
    team: Annotated[str | None, typer.Option(help="Admins: only this team's.")] = None,
) -> Table:
    """List your team's webhook endpoints."""
    data = c.webhooks(team)
    cols = [Col("id"), Col("team"), Col("events"), Col("url")]
    return Table(
        data,
        cols,
        lambda: [[w["id"], w["team_id"], ",".join(w["event_types"] or ["*"]), w["url"]] for w in data],
    )


@webhooks_app.command("delete")
@api_call()
def webhooks_delete(c: RelaxClient, webhook_id: str) -> None:
    """Remove an endpoint and its delivery log."""
    w = c.delete_webhook(webhook_id)
    cmd.out.print(f"deleted {w['id']} ({w['url']})")


def _set_disabled(c: RelaxClient, webhook_id: str, disabled: bool) -> None:
    w = c.update_webhook(webhook_id, disabled=disabled)
    cmd.out.print(f"{'disabled' if disabled else 'enabled'} {w['id']} ({w['url']})")


@webhooks_app.command("disable")
@api_call()
def webhooks_disable(c: RelaxClient, webhook_id: str) -> None:
    """Stop sending to an endpoint (what it has pending fails); `enable` resumes."""
    _set_disabled(c, webhook_id, True)


@webhooks_app.command("enable")
@api_call()
def webhooks_enable(c: RelaxClient, webhook_id: str) -> None:
    """Send to a disabled endpoint again (events from now on)."""
    _set_disabled(c, webhook_id, False)


# the options of both delivery listings
DeliveryStateOpt = Annotated[str | None, typer.Option(help="pending, delivered or failed.")]
DeliveryLimitOpt = Annotated[int, typer.Option(min=1, max=500, help="How many, newest first.")]


def _deliveries_table(data: list[dict], *, urls: bool = False) -> Table:  # type: ignore[type-arg]
    cols = [
        Col("id"),
        Col("event"),
        Col("url", drop=3, wrap=True) if urls else Col("job"),
        Col("state"),
        Col("attempts"),
        Col("last answer", drop=2, wrap=True),
        Col("next attempt", drop=1),
        Col("created"),
    ]

    def rows() -> list[list[str]]:
        return [
            [
                d["id"],
                d["event_type"],
                d["url"] if urls else (d["job_id"] or ""),
                d["state"],
                str(d["attempts"]),
                str(d["last_status_code"] or d["last_error"] or ""),
                (d["next_attempt_at"] or "")[:19].replace("T", " "),
                d["created_at"][:19].replace("T", " "),
            ]
            for d in data
        ]

    return Table(data, cols, rows)


@webhooks_app.command("deliveries")
@api_call("json", "wide")
def webhooks_deliveries(
    c: RelaxClient,
    webhook_id: str,
    state: DeliveryStateOpt = None,
    limit: DeliveryLimitOpt = 50,
) -> Table:
    """The endpoint's messages, newest first: attempts, last answer, next try."""
    return _deliveries_table(c.webhook_deliveries(webhook_id, state=state, limit=limit)["data"])


@webhooks_app.command("job")
@api_call()
def webhooks_job(c: RelaxClient, job_id: str) -> None:
    """A job's --notify-urls that get its status changes, and the job's secret that signs them."""
    n = c.job_notifications(job_id)
    for url in n["urls"]:
        cmd.out.print(url)
    if not n["urls"]:
        cmd.out.print(f"job {n['job_id']} has no --notify-urls")
    cmd.out.print(f"secret: {n['secret']}  (verify each message's webhook-signature with it)")


@webhooks_app.command("job-deliveries")
@api_call("json", "wide")
def webhooks_job_deliveries(
    c: RelaxClient,
    job_id: str,
    state: DeliveryStateOpt = None,
    limit: DeliveryLimitOpt = 50,
) -> Table:
    """The messages to a job's --notify-urls, newest first: URL, attempts, last answer, next try."""
    data = c.job_notification_deliveries(job_id, state=state, limit=limit)["data"]
    return _deliveries_table(data, urls=True)


@webhooks_app.command("retry")
@api_call()
def webhooks_retry(c: RelaxClient, webhook_id: str, delivery_id: str) -> None:
    """Send a delivered or failed message once more (the same webhook-id)."""
    d = c.retry_webhook_delivery(webhook_id, delivery_id)
    cmd.out.print(f"{d['id']} will be sent again (attempt {d['attempts'] + 1})")
