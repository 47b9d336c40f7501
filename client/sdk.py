"""Python SDK of the Relax Platform API (httpx): what the CLI, CI scripts and notebooks call."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from client.files import FilesApi

DEFAULT_URL = "http://127.0.0.1:8400"


class ApiError(Exception):
    """An error envelope from the API."""

    def __init__(
        self, status: int, code: str, message: str, details: Any = None, request_id: str | None = None
    ):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details, self.request_id = (
            status,
            code,
            message,
            details,
            request_id,
        )

    @classmethod
    def of(cls, resp: httpx.Response) -> ApiError:
        """The error a response of status >= 400 answers (its body read): the platform's envelope, or its text
        where the body is not one (a proxy's page)."""
        try:
            err = resp.json()["error"]
        except Exception:
            return cls(resp.status_code, "http_error", resp.text[:500])
        return cls(
            resp.status_code,
            err.get("code", "error"),
            err.get("message", ""),
            err.get("details"),
            err.get("request_id"),
        )

    @property
    def issues(self) -> list[dict[str, Any]]:
        if isinstance(self.details, dict):
            return list(self.details.get("issues", []))
        return []


def sse_messages(lines: Iterable[str]) -> Iterator[tuple[str, str | None, Any]]:
    """Server-sent events: (kind, id, data) of each message once it is whole (its blank line came), `data` its
    `data:` lines joined and read as JSON (`{}` when it has none). Lines without an `event:` are no message."""
    kind: str | None = None
    msg_id: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("id:"):
            msg_id = line[3:].strip()
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and kind:
            yield kind, msg_id, json.loads("\n".join(data) or "{}")
            kind, msg_id, data = None, None, []


def _given(**values: Any) -> dict[str, Any]:
    """The values that are not None: a request's optional parameters and fields, sent only when given."""
    return {k: v for k, v in values.items() if v is not None}


def _is_local(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("127.0.0.1", "localhost", "::1")


def local_home() -> Path:
    """The embedded platform's home on this machine: RELAX_HOME, else `.relax` here."""
    return Path(os.environ.get("RELAX_HOME", ".relax")).expanduser()


def default_api_key(url: str) -> str | None:
    """RELAX_API_KEY, else the embedded platform's admin key when the URL is local."""
    key = os.environ.get("RELAX_API_KEY")
    if key:
        return key
    if _is_local(url):
        path = local_home() / "admin.key"
        if path.exists():
            return path.read_text().strip()
    return None


class RelaxClient:
    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get("RELAX_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key or default_api_key(self.url)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RelaxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def files(self) -> FilesApi:
        """The team's files (`/v1/files`, `/v1/uploads`): upload (in parts when large), list, download with
        resume, delete (client/files.py)."""
        from client.files import FilesApi  # it imports this module

        return FilesApi(self)

    # plumbing ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.ConnectError as err:
            raise ApiError(
                0, "unreachable", f"cannot reach {self.url} ({err}); is the platform up? (`make run`)"
            ) from None
        if resp.status_code >= 400:
            raise ApiError.of(resp)
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    # jobs ----------------------------------------------------------------------------------
    def submit_job(
        self,
        *,
        spec: dict[str, Any] | None = None,
        args: list[str] | None = None,
        name: str | None = None,
        queue: str | None = None,
        team: str | None = None,
        priority_class: str | None = None,
        labels: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        launch_script: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`launch_script` (with `args`): where the flags came from, `ResolvedScript.provenance()`;
        the job keeps it under `submitted.launch_script`."""
        body = {"labels": labels or {}} | _given(
            spec=spec,
            args=args,
            name=name,
            queue=queue,
            team=team,
            priority_class=priority_class,
            launch_script=launch_script,
        )
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._request("POST", "/v1/jobs", json=body, headers=headers)

    def submit_script(
        self,
        path: str | os.PathLike[str],
        *,
        env: dict[str, str] | None = None,
        script_args: list[str] | None = None,
        inherit_env: bool = False,
        script_timeout: float = 30.0,
        **submit: Any,
    ) -> dict[str, Any]:
        """Run a Relax launch script with bash here (client/launch_script.py) and submit its
        training command; raises LaunchScriptError, before any request, when it has none."""
        from client.launch_script import resolve_launch_script

        resolved = resolve_launch_script(
            path, env=env, script_args=script_args or [], timeout_s=script_timeout, inherit_env=inherit_env
        )
        submit.setdefault("name", resolved.job_name)
        return self.submit_job(args=resolved.argv, launch_script=resolved.provenance(), **submit)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}")

    def list_jobs(self, **filters: Any) -> dict[str, Any]:
        return self._request("GET", "/v1/jobs", params=_given(**filters))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{job_id}/cancel")

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return self._request("GET", f"/v1/jobs/{job_id}/events")["data"]

    def metrics(
        self, job_id: str, names: list[str] | None = None, since_step: int | None = None
    ) -> dict[str, list[dict]]:
        params = _given(names=",".join(names) if names else None, since_step=since_step)
        return self._request("GET", f"/v1/jobs/{job_id}/metrics", params=params)["series"]

    def logs(self, job_id: str, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}/logs", params={"after": after, "limit": limit})

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        return self._request("GET", f"/v1/jobs/{job_id}/checkpoints")["data"]

    def rollouts(self, job_id: str) -> list[dict[str, Any]]:
        return self._request("GET", f"/v1/jobs/{job_id}/rollouts")["data"]

    def stream(self, job_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """Server-sent events of a job until it ends: (kind, data) with kind in status, event,
        metric, log, end."""
        with self._http.stream(
            "GET", f"/v1/jobs/{job_id}/stream", timeout=httpx.Timeout(30, read=120)
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise ApiError.of(resp)
            for kind, _, data in sse_messages(resp.iter_lines()):
                yield kind, data
                if kind == "end":
                    return

    # specs and platform --------------------------------------------------------------------
    def validate_spec(
        self,
        *,
        spec: dict[str, Any] | None = None,
        args: list[str] | None = None,
        queue: str | None = None,
        launch_script: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = _given(spec=spec, args=args, queue=queue, launch_script=launch_script)
        return self._request("POST", "/v1/specs/validate", json=body)

    def pools(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/pools")["data"]

    def queues(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/queues")["data"]

    def teams(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/teams")["data"]

    def create_team(self, name: str) -> dict[str, Any]:
        return self._request("POST", "/v1/teams", json={"name": name})

    def team(self, team: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/teams/{team}")

    def update_team(self, team: str, **changes: Any) -> dict[str, Any]:
        """Set `allowed_priority_classes` / `allowed_queues` (a list, or None for the default)."""
        return self._request("PATCH", f"/v1/teams/{team}", json=changes)

    def create_api_key(
        self,
        name: str,
        role: str = "member",
        team: str | None = None,
        *,
        expires_in_days: int | None = None,
        expires_at: str | None = None,
    ) -> dict[str, Any]:
        body = {"name": name, "role": role, "team": team} | _given(
            expires_in_days=expires_in_days, expires_at=expires_at
        )
        return self._request("POST", "/v1/api-keys", json=body)

    def api_keys(self, team: str | None = None) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/api-keys", params={"team": team} if team else None)["data"]

    def revoke_api_key(self, key_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/api-keys/{key_id}")

    def audit(self, **filters: Any) -> dict[str, Any]:
        """A page of the audit log (admin): filters since, key, team, path, after, limit."""
        return self._request("GET", "/v1/admin/audit", params=_given(**filters))

    def create_pool(
        self,
        name: str,
        accelerator: str,
        *,
        ray_address: str | None = None,
        python: str | None = None,
        nodes: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        return self._request(
            "POST",
            "/v1/pools",
            json={
                "name": name,
                "accelerator": accelerator,
                "ray_address": ray_address,
                "python": python,
                "nodes": nodes or [],
            },
        )

    def update_pool(self, name: str, **changes: Any) -> dict[str, Any]:
        return self._request("PATCH", f"/v1/pools/{name}", json=changes)

    def put_node(
        self, pool: str, node: str, gpus: int, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        return self._request(
            "PUT", f"/v1/pools/{pool}/nodes/{node}", json={"name": node, "gpus": gpus, "labels": labels or {}}
        )

    def update_node(self, pool: str, node: str, **changes: Any) -> dict[str, Any]:
        return self._request("PATCH", f"/v1/pools/{pool}/nodes/{node}", json=changes)

    def drain_node(self, pool: str, node: str) -> dict[str, Any]:
        return self._request("POST", f"/v1/pools/{pool}/nodes/{node}/drain")

    def create_queue(
        self,
        name: str,
        pool: str,
        team: str,
        nominal_gpus: int,
        *,
        borrowing_limit: int | None = None,
        lending_limit: int | None = None,
        weight: float = 1.0,
    ) -> dict[str, Any]:
        return self._request(
            "POST",
            "/v1/queues",
            json={
                "name": name,
                "pool": pool,
                "team": team,
                "nominal_gpus": nominal_gpus,
                "borrowing_limit": borrowing_limit,
                "lending_limit": lending_limit,
                "weight": weight,
            },
        )

    def update_queue(self, name: str, **changes: Any) -> dict[str, Any]:
        return self._request("PATCH", f"/v1/queues/{name}", json=changes)

    def priority_classes(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/priority-classes")["data"]

    def create_priority_class(
        self, name: str, value: int, *, preemptible: bool = True, description: str | None = None
    ) -> dict[str, Any]:
        return self._request(
            "POST",
            "/v1/priority-classes",
            json={"name": name, "value": value, "preemptible": preemptible, "description": description},
        )

    # storage: the team's area and path grants ----------------------------------------------
    def storage(self, team: str | None = None, pool: str | None = None) -> dict[str, Any]:
        """Where your team's jobs may read and write: `area` (what artifacts:// names), `jobs`, `grants`."""
        return self._request("GET", "/v1/storage", params=_given(team=team, pool=pool) or None)

    def path_grants(self, team: str | None = None) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/admin/path-grants", params={"team": team} if team else None)["data"]

    def add_path_grant(
        self, team: str, path: str, mode: str = "ro", pool: str | None = None
    ) -> dict[str, Any]:
        body = {"team": team, "path": path, "mode": mode, "pool": pool}
        return self._request("POST", "/v1/admin/path-grants", json=body)

    def remove_path_grant(self, grant_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/admin/path-grants/{grant_id}")

    # webhooks: the team's endpoints and their delivery log (docs/reference/webhooks.md) ----------
    def webhooks(self, team: str | None = None) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/webhooks", params={"team": team} if team else None)["data"]

    def create_webhook(
        self,
        url: str,
        event_types: list[str] | None = None,
        description: str | None = None,
        team: str | None = None,
    ) -> dict[str, Any]:
        """A new endpoint; the answer's `secret` (whsec_…) is shown this once."""
        body = _given(url=url, event_types=event_types, description=description, team=team)
        return self._request("POST", "/v1/webhooks", json=body)

    def update_webhook(self, webhook_id: str, **changes: Any) -> dict[str, Any]:
        """Change `url`, `event_types`, `description` or `disabled` (only those given)."""
        return self._request("PATCH", f"/v1/webhooks/{webhook_id}", json=changes)

    def delete_webhook(self, webhook_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/webhooks/{webhook_id}")

    def webhook_deliveries(
        self, webhook_id: str, state: str | None = None, after: str | None = None, limit: int = 50
    ) -> dict[str, Any]:
        """A page of the endpoint's deliveries, newest first: `data`, `next_cursor`."""
        return self._deliveries(f"/v1/webhooks/{webhook_id}/deliveries", state, after, limit)

    def retry_webhook_delivery(self, webhook_id: str, delivery_id: str) -> dict[str, Any]:
        return self._request("POST", f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/retry")

    def job_notifications(self, job_id: str) -> dict[str, Any]:
        """A job's --notify-urls that get its status changes (`urls`) and the job's signing `secret`."""
        return self._request("GET", f"/v1/webhooks/jobs/{job_id}")

    def job_notification_deliveries(
        self, job_id: str, state: str | None = None, after: str | None = None, limit: int = 50
    ) -> dict[str, Any]:
        """A page of the messages to the job's --notify-urls, newest first: `data`, `next_cursor`."""
        return self._deliveries(f"/v1/webhooks/jobs/{job_id}/deliveries", state, after, limit)

    def _deliveries(self, path: str, state: str | None, after: str | None, limit: int) -> dict[str, Any]:
        return self._request("GET", path, params=_given(state=state, after=after, limit=limit))

    # evals: CI evals of a model against thresholds (docs/reference/evals.md) -----------------------------
    def create_eval(
        self,
        *,
        thresholds: list[str | dict[str, Any]],
        model_path: str | None = None,
        model_job: str | None = None,
        checkpoint_step: int | None = None,
        eval_prompt_data: list[str] | None = None,
        eval_config: str | None = None,
        n_samples_per_eval_prompt: int = 1,
        pass_at_k: bool | None = None,
        spec: dict[str, Any] | None = None,
        name: str | None = None,
        team: str | None = None,
        queue: str | None = None,
        priority_class: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run an eval: the model (`model_path`, or `model_job` with an optional `checkpoint_step`) on eval sets
        (`eval_prompt_data` name/path pairs or `eval_config`), against `thresholds` (`"eval/gsm8k >= 0.6"`)."""
        body = _given(
            model=_given(path=model_path, job=model_job, checkpoint_step=checkpoint_step),
            thresholds=thresholds,
            eval_prompt_data=eval_prompt_data,
            eval_config=eval_config,
            n_samples_per_eval_prompt=n_samples_per_eval_prompt,
            pass_at_k=pass_at_k,
            spec=spec,
            name=name,
            team=team,
            queue=queue,
            priority_class=priority_class,
            labels=labels,
        )
        return self._request("POST", "/v1/evals", json=body)

    def get_eval(self, eval_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/evals/{eval_id}")

    def list_evals(
        self,
        model: str | None = None,
        outcome: str | None = None,
        team: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """A page of evals, newest first (`model`: one model's history, by its model_key): `data`, `next_cursor`."""
        params = _given(model=model, outcome=outcome, team=team, after=after, limit=limit)
        return self._request("GET", "/v1/evals", params=params)

    def wait_eval(
        self,
        eval_id: str,
        *,
        timeout: float | None = None,
        poll_s: float = 2.0,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """The eval once it ended (passed, failed, error); TimeoutError after `timeout` seconds. `on_change` gets
        the eval each time its job's status changes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = None
        while True:
            ev = self.get_eval(eval_id)
            if on_change is not None and ev.get("job_status") != seen:
                seen = ev.get("job_status")
                on_change(ev)
            if ev["outcome"] != "running":
                return ev
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"eval {eval_id} still running after {timeout:.0f}s (job {ev['job_id']})")
            time.sleep(poll_s)

    # OpenAI-compatible fine-tuning (`/v1/fine_tuning/jobs`; docs/reference/fine-tuning.md): each one is a job of
    # the team, so `get_job` and the job routes read it too. The official `openai` SDK speaks the same routes.
    def create_fine_tuning_job(self, *, model: str, training_file: str, **fields: Any) -> dict[str, Any]:
        """`fields`: OpenAI's (validation_file, suffix, seed, metadata, method={"type": "supervised" |
        "reinforcement", ...}, hyperparameters) and the platform's `team` (an admin's)."""
        return self._request(
            "POST", "/v1/fine_tuning/jobs", json={"model": model, "training_file": training_file, **fields}
        )

    def list_fine_tuning_jobs(self, *, after: str | None = None, limit: int = 20) -> dict[str, Any]:
        """A page, newest first: `data`, `has_more` (pass the last id as `after`)."""
        return self._request("GET", "/v1/fine_tuning/jobs", params=_given(after=after, limit=limit))

    def get_fine_tuning_job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/fine_tuning/jobs/{job_id}")

    def cancel_fine_tuning_job(self, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"/v1/fine_tuning/jobs/{job_id}/cancel")

    def fine_tuning_events(self, job_id: str, *, after: str | None = None, limit: int = 20) -> dict[str, Any]:
        return self._request(
            "GET", f"/v1/fine_tuning/jobs/{job_id}/events", params=_given(after=after, limit=limit)
        )

    def fine_tuning_checkpoints(
        self, job_id: str, *, after: str | None = None, limit: int = 10
    ) -> dict[str, Any]:
        params = _given(after=after, limit=limit)
        return self._request("GET", f"/v1/fine_tuning/jobs/{job_id}/checkpoints", params=params)

    def login_code(self) -> dict[str, Any]:
        """A one-time code (`code`, `expires_in` s) that signs a browser in to the dashboard as this key:
        `<url>/#code=<code>` (what `relaxctl dashboard` opens)."""
        return self._request("POST", "/v1/auth/login-codes")

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/readyz")
