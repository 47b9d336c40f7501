"""`relaxctl files` and the SDK's side of `/v1/files` and `/v1/uploads` (docs: README, "Files over HTTP").

A file up to `PART_THRESHOLD` bytes goes whole (`POST /v1/files`); a larger one in parts (`/v1/uploads`), each
part retried on failure (a part sent again is the same part on the server). A download resumes with Range where
a previous one stopped (`<dest>.part`)."""

from __future__ import annotations

import hashlib
import mimetypes
import os
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from client import commands as cmd
from client.commands import Table, api_call
from client.display import Col
from client.sdk import ApiError, RelaxClient

PART_THRESHOLD = 64 * 1024 * 1024  # whole up to this; in parts above
PART_BYTES = 32 * 1024 * 1024
PART_TRIES = 5


def _type_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".tar.gz", ".tgz")):
        return "application/gzip"
    if name.endswith(".jsonl"):
        return "application/jsonl"
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


class FilesApi:
    """The files of the client's team."""

    def __init__(self, client: RelaxClient) -> None:
        self.c = client

    def upload(
        self,
        path: str | Path,
        *,
        purpose: str,
        team: str | None = None,
        part_bytes: int = PART_BYTES,
        threshold: int = PART_THRESHOLD,
    ) -> dict[str, Any]:
        path = Path(path)
        size = path.stat().st_size
        ctype = _type_of(path)
        if size <= threshold:
            with open(path, "rb") as fh:
                return self.c._request(
                    "POST",
                    "/v1/files",
                    files={"file": (path.name, fh, ctype)},
                    data={"purpose": purpose, **({"team": team} if team else {})},
                )
        up = self.c._request(
            "POST",
            "/v1/uploads",
            json={"filename": path.name, "purpose": purpose, "bytes": size, "mime_type": ctype, "team": team},
        )
        md5, ids = hashlib.md5(usedforsecurity=False), []
        with open(path, "rb") as fh:
            while chunk := fh.read(part_bytes):
                md5.update(chunk)
                ids.append(self._part(up["id"], chunk))
        done = self.c._request(
            "POST", f"/v1/uploads/{up['id']}/complete", json={"part_ids": ids, "md5": md5.hexdigest()}
        )
        return done["file"]

    def _part(self, upload_id: str, chunk: bytes) -> str:
        """One part, sent again after a failure (the server answers the same part for the same bytes)."""
        for attempt in range(PART_TRIES):
            try:
                return self.c._request(
                    "POST", f"/v1/uploads/{upload_id}/parts", files={"data": ("part", chunk)}
                )["id"]
            except (httpx.TransportError, ApiError) as err:
                if isinstance(err, ApiError) and err.status and err.status < 500:
                    raise
                if attempt == PART_TRIES - 1:
                    raise
                time.sleep(min(2**attempt, 10))
        raise AssertionError("unreachable")

    def list(self, *, purpose: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = None
        while True:
            params: dict[str, Any] = {"limit": min(limit, 1000)}
            if purpose:
                params["purpose"] = purpose
            if after:
                params["after"] = after
            page = self.c._request("GET", "/v1/files", params=params)
            out += page["data"]
            after = page.get("next_cursor")
            if not after or len(out) >= limit:
                return out[:limit]

    def get(self, file_id: str) -> dict[str, Any]:
        return self.c._request("GET", f"/v1/files/{file_id}")

    def delete(self, file_id: str) -> dict[str, Any]:
        return self.c._request("DELETE", f"/v1/files/{file_id}")

    def download(self, file_id: str, dest: str | Path) -> Path:
        """The file's bytes into `dest`, resuming from `<dest>.part` with Range when a previous try stopped."""
        dest = Path(dest)
        tmp = dest.with_name(dest.name + ".part")
        have = tmp.stat().st_size if tmp.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        with self.c._http.stream("GET", f"/v1/files/{file_id}/content", headers=headers) as resp:
            if resp.status_code == 416:  # the part file is whole already
                os.replace(tmp, dest)
                return dest
            if resp.status_code >= 400:
                resp.read()
                raise ApiError.of(resp)
            mode = "ab" if resp.status_code == 206 else "wb"
            with open(tmp, mode) as out:
                for chunk in resp.iter_bytes(1024 * 1024):
                    out.write(chunk)
        os.replace(tmp, dest)
        return dest


files_app = typer.Typer(help="Upload, list, download and delete your team's files.", no_args_is_help=True)


@files_app.command("upload")
@api_call("json")
def files_upload(
    c: RelaxClient,
    path: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="The file (a model folder: a .tar/.zip).")
    ],
    purpose: Annotated[str, typer.Option(help="dataset, fine-tune, evals, model, ...")] = "dataset",
    team: Annotated[str | None, typer.Option(help="Admins: the team (name or id).")] = None,
    *,
    as_json: bool = False,
) -> None:
    """Upload PATH (in parts when large, each retried); prints the id a job names as file://<id>."""
    f = FilesApi(c).upload(path, purpose=purpose, team=team)
    if as_json:
        cmd.print_json(f)
        return
    cmd.out.print(f"{f['id']}  {f['bytes']} bytes  {f['kind']}  use: {f['uri']}", highlight=False)


@files_app.command("list")
@api_call("json")
def files_list(
    c: RelaxClient,
    purpose: Annotated[str | None, typer.Option(help="Only files of this purpose.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 100,
) -> Table:
    """List your team's files, newest first."""
    data = FilesApi(c).list(purpose=purpose, limit=limit)
    cols = [Col("id"), Col("purpose"), Col("bytes"), Col("kind"), Col("filename")]
    return Table(
        data, cols, lambda: [[f["id"], f["purpose"], str(f["bytes"]), f["kind"], f["filename"]] for f in data]
    )


@files_app.command("download")
@api_call("json")
def files_download(
    c: RelaxClient,
    file_id: Annotated[str, typer.Argument(metavar="ID")],
    dest: Annotated[Path | None, typer.Argument(help="Where to write it (default: its name, here).")] = None,
) -> None:
    """Download a file; run it again after an interruption to resume where it stopped."""
    api = FilesApi(c)
    target = dest or Path(api.get(file_id)["filename"])
    api.download(file_id, target)
    cmd.out.print(str(target))


@files_app.command("delete")
@api_call("json")
def files_delete(c: RelaxClient, file_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Delete a file and its bytes."""
    FilesApi(c).delete(file_id)
    cmd.out.print(f"deleted {file_id}")
