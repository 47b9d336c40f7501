"""Files over HTTP, end to end through the real app (TestClient) over SQLite and PostgreSQL: uploads whole and in
parts, listing in pages, Range downloads, quota, content types and purposes, model archives unpacked safely,
nothing half-written after a failure, team isolation, and `file://<id>` in a submitted job's spec."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from api.app import create_app
from scheduler.db.engine import Database
from scheduler.db.models import AuditEvent, FileUploadPart, Job, StoredFile
from scheduler.dispatch import CeleryDispatcher
from scheduler.services import platform
from scheduler.services.auth import Principal, create_api_key
from scheduler.services.paths import team_area
from scheduler.settings import CelerySettings, DatabaseSettings, FileSettings, Settings
from tests.factories import bootstrap, grpo_spec, make_broker_app

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)


@dataclass
class World:
    client: TestClient
    db: Database
    settings: Settings
    keys: dict[str, str]
    teams: dict[str, str]  # name -> id

    def as_(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def area(self, team: str) -> Path:
        return team_area(self.settings.artifacts, self.teams[team])


def make_world(db_url: str, tmp_path: Path, files: FileSettings | None = None) -> World:
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
        files=files
        or FileSettings(
            team_quota_bytes=200_000, max_file_bytes=50_000, max_part_bytes=20_000, max_upload_bytes=150_000
        ),
    )
    db = Database(db_url)
    bootstrap(db, tmp_path)
    keys, teams = {}, {}
    with db.session() as s:
        for name in ("alpha", "omega"):
            team = platform.create_team(s, ADMIN, name)
            platform.create_queue(
                s, ADMIN, name=f"{name}-q", pool="local", team=name, nominal_gpus=1,
                borrowing_limit=None, lending_limit=None, weight=1.0,
            )  # fmt: skip
            teams[name] = team.id
            _, keys[name] = create_api_key(s, name=f"{name}-member", role="member", team_id=team.id)
        _, keys["viewer"] = create_api_key(s, name="alpha-viewer", role="viewer", team_id=teams["alpha"])
    app = create_app(
        settings, db=db, dispatcher=CeleryDispatcher(make_broker_app(settings.broker_url, tmp_path))
    )
    return World(TestClient(app), db, settings, keys, teams)


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> Iterator[World]:
    w = make_world(db_url, tmp_path)
    with w.client:
        yield w
    w.db.dispose()


@pytest.fixture
def sqlite_world(tmp_path: Path) -> Iterator[World]:
    from tests.dbclone import migrated_sqlite

    w = make_world(migrated_sqlite(tmp_path / "relax.db"), tmp_path)  # a copy of one `upgrade()` migrated
    with w.client:
        yield w
    w.db.dispose()


def upload(
    w: World, who: str, name: str, data: bytes, purpose: str = "dataset", ctype: str = "application/jsonl"
):  # type: ignore[no-untyped-def]
    return w.client.post(
        "/v1/files", files={"file": (name, data, ctype)}, data={"purpose": purpose}, headers=w.as_(who)
    )


def _tar(members: dict[str, bytes], extra: list[tarfile.TarInfo] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tf.addfile(info)
    return buf.getvalue()


def _files_on_disk(w: World, team: str) -> list[str]:
    root = w.area(team) / "files"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


# ---------------------------------------------------------------------------------------------------------
def test_upload_list_get_download_delete(world: World) -> None:
    w = world
    data = b'{"prompt": "1+1", "label": "2"}\n' * 100
    r = upload(w, "alpha", "train.jsonl", data)
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["object"] == "file" and f["bytes"] == len(data) and f["purpose"] == "dataset"
    assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["uri"] == f"file://{f['id']}"
    assert f["team_id"] == w.teams["alpha"] and f["kind"] == "file"
    # its bytes are in alpha's own area, and nothing is left in staging
    assert _files_on_disk(w, "alpha") == [f"{f['id']}/train.jsonl"]

    got = w.client.get(f"/v1/files/{f['id']}/content", headers=w.as_("viewer"))
    assert got.status_code == 200 and got.content == data
    part = w.client.get(f"/v1/files/{f['id']}/content", headers={**w.as_("alpha"), "Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    tail = w.client.get(f"/v1/files/{f['id']}/content", headers={**w.as_("alpha"), "Range": "bytes=-5"})
    assert tail.status_code == 206 and tail.content == data[-5:]
    for bad in (f"bytes={len(data)}-", "bytes=9-3", "bytes=x-1"):
        r = w.client.get(f"/v1/files/{f['id']}/content", headers={**w.as_("alpha"), "Range": bad})
        assert r.status_code == 416, (bad, r.text)
        assert r.json()["error"]["code"] == "file.range_not_satisfiable"

    # pages: three more, listed two at a time, newest first
    ids = [f["id"]] + [upload(w, "alpha", f"d{i}.jsonl", b"x\n" * (i + 1)).json()["id"] for i in range(3)]
    seen, after = [], None
    while True:
        page = w.client.get(
            "/v1/files", params={"limit": 2, **({"after": after} if after else {})}, headers=w.as_("viewer")
        ).json()
        assert page["object"] == "list"
        seen += [d["id"] for d in page["data"]]
        if not page["has_more"]:
            break
        after = page["next_cursor"]
        assert after == page["last_id"]
    assert seen == ids[::-1]
    assert [d["id"] for d in w.client.get("/v1/files", headers=w.as_("omega")).json()["data"]] == []
    assert w.client.get("/v1/files", params={"purpose": "model"}, headers=w.as_("alpha")).json()["data"] == []

    # another team's file is answered as missing, everywhere
    for method, path in (
        ("GET", f"/v1/files/{f['id']}"),
        ("GET", f"/v1/files/{f['id']}/content"),
        ("DELETE", f"/v1/files/{f['id']}"),
    ):
        r = w.client.request(method, path, headers=w.as_("omega"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "file.not_found"
    # a viewer reads, never writes
    assert upload(w, "viewer", "v.jsonl", b"x").status_code == 403
    assert w.client.delete(f"/v1/files/{f['id']}", headers=w.as_("viewer")).status_code == 403

    r = w.client.delete(f"/v1/files/{f['id']}", headers=w.as_("alpha"))
    assert r.status_code == 200 and r.json() == {"id": f["id"], "object": "file", "deleted": True}
    assert w.client.get(f"/v1/files/{f['id']}", headers=w.as_("alpha")).status_code == 404
    assert not (w.area("alpha") / "files" / f["id"]).exists()
    with w.db.session(read_only=True) as s:
        audited = {(a.method, a.path) for a in s.scalars(sa.select(AuditEvent))}
    assert ("POST", "/v1/files") in audited and ("DELETE", "/v1/files/{file_id}") in audited


def test_refusals_keep_nothing(world: World) -> None:
    w = world
    # a bad purpose names the field
    r = upload(w, "alpha", "a.jsonl", b"x", purpose="nonsense")
    assert r.status_code == 422 and r.json()["error"]["details"]["issues"][0]["field"] == "purpose"
    # not multipart: 415
    r = w.client.post("/v1/files", json={"purpose": "dataset"}, headers=w.as_("alpha"))
    assert r.status_code == 415, r.text
    # a content type that is no dataset or model: 415
    r = upload(w, "alpha", "cat.png", b"\x89PNG", ctype="image/png")
    assert r.status_code == 415 and r.json()["error"]["details"]["issues"][0]["field"] == "file"
    # larger than a whole file may be: 413 with a hint to use uploads
    r = upload(w, "alpha", "big.jsonl", b"x" * 50_001)
    assert r.status_code == 413 and "/v1/uploads" in r.json()["error"]["details"]["issues"][0]["hint"]
    # over the quota (200,000 bytes): 413, nothing kept
    for i in range(4):
        assert (
            upload(w, "alpha", f"f{i}.bin", b"y" * 45_000, ctype="application/octet-stream").status_code
            == 200
        )
    r = upload(w, "alpha", "one-too-many.bin", b"z" * 45_000, ctype="application/octet-stream")
    assert r.status_code == 413 and r.json()["error"]["code"] == "file.over_quota"
    assert "relaxctl files delete" in r.json()["error"]["details"]["issues"][0]["hint"]
    # the other team's quota is its own
    assert upload(w, "omega", "o.bin", b"z" * 45_000, ctype="application/octet-stream").status_code == 200
    with w.db.session(read_only=True) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(StoredFile)) == 5
    assert len(_files_on_disk(w, "alpha")) == 4  # no staging leftovers


def test_upload_in_parts_resumable_and_idempotent(world: World) -> None:
    w = world
    data = bytes(range(256)) * 200  # 51,200 bytes: over the whole-file limit
    h = w.as_("alpha")
    up = w.client.post(
        "/v1/uploads",
        json={
            "filename": "model.safetensors",
            "purpose": "model",
            "bytes": len(data),
            "mime_type": "application/octet-stream",
        },
        headers=h,
    )
    assert up.status_code == 200, up.text
    up = up.json()
    assert up["object"] == "upload" and up["status"] == "pending"
    chunks = [data[i : i + 20_000] for i in range(0, len(data), 20_000)]
    ids = []
    for chunk in chunks:
        r = w.client.post(f"/v1/uploads/{up['id']}/parts", files={"data": ("blob", chunk)}, headers=h)
        assert r.status_code == 200, r.text
        ids.append(r.json()["id"])
    # a part sent again (its answer lost) is the same part
    again = w.client.post(f"/v1/uploads/{up['id']}/parts", files={"data": ("blob", chunks[1])}, headers=h)
    assert again.json()["id"] == ids[1]
    # a part over the part limit: 413
    r = w.client.post(f"/v1/uploads/{up['id']}/parts", files={"data": ("blob", b"q" * 20_001)}, headers=h)
    assert r.status_code == 413
    # completing with parts missing, or out of order (md5): 422 naming the field
    r = w.client.post(f"/v1/uploads/{up['id']}/complete", json={"part_ids": ids[:2]}, headers=h)
    assert r.status_code == 422 and r.json()["error"]["details"]["issues"][0]["field"] == "part_ids"
    md5 = hashlib.md5(data).hexdigest()
    r = w.client.post(
        f"/v1/uploads/{up['id']}/complete", json={"part_ids": [ids[1], ids[0], ids[2]], "md5": md5}, headers=h
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "upload.md5_mismatch"
    # another team cannot add to it or complete it
    r = w.client.post(f"/v1/uploads/{up['id']}/complete", json={"part_ids": ids}, headers=w.as_("omega"))
    assert r.status_code == 404
    r = w.client.post(f"/v1/uploads/{up['id']}/complete", json={"part_ids": ids, "md5": md5}, headers=h)
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["status"] == "completed" and done["file"]["bytes"] == len(data)
    assert w.client.get(f"/v1/files/{done['file']['id']}/content", headers=h).content == data
    # the parts are gone; a completed upload takes no more parts
    assert not (w.area("alpha") / "files" / ".uploads" / up["id"]).exists()
    with w.db.session(read_only=True) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(FileUploadPart)) == 0
    r = w.client.post(f"/v1/uploads/{up['id']}/parts", files={"data": ("blob", b"x")}, headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "upload.completed"


def test_upload_cancel_expiry_and_quota(sqlite_world: World) -> None:
    w = sqlite_world
    h = w.as_("alpha")
    body = {
        "filename": "m.bin",
        "purpose": "model",
        "bytes": 150_000,
        "mime_type": "application/octet-stream",
    }
    up = w.client.post("/v1/uploads", json=body, headers=h).json()
    # what it declared counts against the quota while it is pending
    r = w.client.post("/v1/uploads", json={**body, "bytes": 60_000}, headers=h)
    assert r.status_code == 413 and r.json()["error"]["code"] == "file.over_quota"
    assert w.client.post("/v1/uploads", json={**body, "bytes": 150_001}, headers=h).status_code == 413
    assert w.client.post("/v1/uploads", json={**body, "purpose": "x"}, headers=h).status_code == 422
    assert w.client.post("/v1/uploads", json={**body, "mime_type": "video/mp4"}, headers=h).status_code == 415
    w.client.post(f"/v1/uploads/{up['id']}/parts", files={"data": ("b", b"a" * 100)}, headers=h)
    r = w.client.post(f"/v1/uploads/{up['id']}/cancel", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert not (w.area("alpha") / "files" / ".uploads" / up["id"]).exists()
    # an upload past its time is expired: no parts, no completion, no quota held
    up2 = w.client.post("/v1/uploads", json={**body, "bytes": 100}, headers=h).json()
    with w.db.session() as s:
        from scheduler.db.models import FileUpload, utcnow

        s.get(FileUpload, up2["id"]).expires_at = utcnow()
    r = w.client.post(f"/v1/uploads/{up2['id']}/parts", files={"data": ("b", b"a")}, headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "upload.expired"
    assert w.client.get(f"/v1/uploads/{up2['id']}", headers=h).json()["status"] == "expired"
    assert w.client.post("/v1/uploads", json=body, headers=h).status_code == 200


def test_model_archives_unpack_safely(sqlite_world: World) -> None:
    w = sqlite_world
    good = _tar({"tiny/config.json": b"{}", "tiny/model.safetensors": b"w" * 1000})
    r = upload(w, "alpha", "tiny.tar.gz", good, purpose="model", ctype="application/gzip")
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["kind"] == "folder" and f["archive_entries"] == 2 and f["stored_bytes"] == len(good) + 1002
    folder = w.area("alpha") / "files" / f["id"] / "model" / "tiny"
    assert (folder / "config.json").read_bytes() == b"{}"
    # zip too
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("config.json", "{}")
    assert (
        upload(w, "alpha", "m.zip", buf.getvalue(), purpose="model", ctype="application/zip").status_code
        == 200
    )

    link = tarfile.TarInfo("tiny/evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc"
    hard = tarfile.TarInfo("tiny/hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "../../secret"
    fifo = tarfile.TarInfo("tiny/fifo")
    fifo.type = tarfile.FIFOTYPE
    bad = {
        "traversal": _tar({"../../escape.txt": b"x"}),
        "absolute": _tar({"/etc/cron.d/x": b"x"}),
        "symlink": _tar({"a": b"x"}, [link]),
        "hardlink": _tar({"a": b"x"}, [hard]),
        "fifo": _tar({"a": b"x"}, [fifo]),
        "not an archive": b"this is not a tar",
        "bomb": _tar({f"f{i}": b"0" * 60_000 for i in range(4)}),  # unpacks past the quota
    }
    before = _files_on_disk(w, "alpha")
    for what, blob in bad.items():
        r = upload(w, "alpha", "m.tar.gz", blob, purpose="model", ctype="application/gzip")
        assert r.status_code in (413, 422), (what, r.text)
        assert r.json()["error"]["details"]["issues"][0]["field"] == "file", what
    assert _files_on_disk(w, "alpha") == before  # nothing half-unpacked survives
    assert not (w.settings.artifacts / "escape.txt").exists()


def test_a_job_refers_to_files_by_id(world: World) -> None:
    w = world
    h = w.as_("alpha")
    model = upload(
        w, "alpha", "tiny.tar", _tar({"tiny/config.json": b"{}"}), purpose="model", ctype="application/x-tar"
    )
    data = upload(w, "alpha", "train.jsonl", b'{"prompt": "1+1", "label": "2"}\n')
    mid, did = model.json()["id"], data.json()["id"]
    spec = grpo_spec(**{"hf-checkpoint": f"file://{mid}", "prompt-data": f"file://{did}"})
    r = w.client.post("/v1/jobs", json={"spec": spec, "queue": "alpha-q", "name": "uses-files"}, headers=h)
    assert r.status_code == 201, r.text
    with w.db.session(read_only=True) as s:
        job = s.get(Job, r.json()["id"])
        assert job.spec["hf_checkpoint"] == str(
            (w.area("alpha") / "files" / mid / "model" / "tiny").resolve()
        )
        assert job.spec["prompt_data"] == str((w.area("alpha") / "files" / did / "train.jsonl").resolve())
    # another team's id is the same refusal as an unknown one, with a hint
    for ref in (did, "file_nope"):
        spec = grpo_spec(**{"prompt-data": f"file://{ref}"})
        r = w.client.post("/v1/jobs", json={"spec": spec, "queue": "omega-q"}, headers=w.as_("omega"))
        assert r.status_code == 422, r.text
        (issue,) = [i for i in r.json()["error"]["details"]["issues"] if i["field"] == "prompt-data"]
        assert issue["code"] == "spec.unknown_file_reference"
        assert "relaxctl files" in issue["hint"] and str(w.area("alpha")) not in r.text
    # a file is an input only, and '..' does not leave it
    base = {"hf-checkpoint": f"file://{mid}", "prompt-data": f"file://{did}"}
    for field, value in (("save", f"file://{did}"), ("prompt-data", f"file://{mid}/../../x")):
        r = w.client.post(
            "/v1/jobs", json={"spec": grpo_spec(**{**base, field: value}), "queue": "alpha-q"}, headers=h
        )
        assert r.status_code == 422 and [i["field"] for i in r.json()["error"]["details"]["issues"]] == [
            field
        ]


def test_job_artifacts_download_with_range(sqlite_world: World) -> None:
    """Checkpoints and exports (`GET /v1/jobs/{id}/artifacts/{path}`) stream with Range, to resume a download."""
    from tests.factories import make_job

    w = sqlite_world
    job_id = make_job(w.db, queue="alpha-q", name="exporter", artifact_root=w.settings.artifacts)
    with w.db.session(read_only=True) as s:
        out = Path(s.get(Job, job_id).output_dir)
    (out / "hf").mkdir(parents=True)
    blob = bytes(range(256)) * 40
    (out / "hf" / "model.safetensors").write_bytes(blob)
    path = f"/v1/jobs/{job_id}/artifacts/hf/model.safetensors"
    h = w.as_("viewer")
    assert w.client.get(path, headers=h).content == blob
    r = w.client.get(path, headers={**h, "Range": "bytes=1000-"})
    assert r.status_code == 206 and r.content == blob[1000:]
    assert r.headers["content-range"] == f"bytes 1000-{len(blob) - 1}/{len(blob)}"
    assert w.client.get(path, headers={**h, "Range": f"bytes={len(blob)}-"}).status_code == 416
    assert w.client.get(path, headers=w.as_("omega")).status_code == 404


def test_sdk_uploads_in_parts_and_resumes_a_download(sqlite_world: World, tmp_path: Path) -> None:
    """client/files.py over the real app: a file over the threshold goes in parts; a download resumes with Range."""
    from client.files import FilesApi
    from client.sdk import RelaxClient

    w = sqlite_world
    c = RelaxClient("http://testserver", "unused")
    c._http = w.client  # the TestClient is an httpx.Client over the app
    w.client.headers.update(w.as_("alpha"))
    src = tmp_path / "weights.bin"
    blob = bytes(range(256)) * 400  # 102,400 bytes: in parts of 20,000
    src.write_bytes(blob)
    f = c.files.upload(src, purpose="model", part_bytes=20_000, threshold=30_000)  # the SDK's own entry
    assert f["bytes"] == len(blob) and [x["id"] for x in FilesApi(c).list()] == [f["id"]]
    dest = tmp_path / "out.bin"
    (tmp_path / "out.bin.part").write_bytes(blob[:12_345])  # a download that stopped
    FilesApi(c).download(f["id"], dest)
    assert dest.read_bytes() == blob and not (tmp_path / "out.bin.part").exists()
    FilesApi(c).delete(f["id"])
    assert FilesApi(c).list() == []


def test_the_official_openai_sdk_is_a_client(sqlite_world: World) -> None:
    """`/v1/files` and `/v1/uploads` in OpenAI's shapes: the `openai` package, pointed at the platform with a team
    key, uploads, lists, retrieves, reads, uploads in parts and deletes (issue 15 item 5 builds on this)."""
    openai = pytest.importorskip("openai")
    w = sqlite_world
    oc = openai.OpenAI(api_key=w.keys["alpha"], base_url="http://testserver/v1", http_client=w.client)
    data = b'{"messages": [{"role": "user", "content": "hi"}]}\n'
    f = oc.files.create(file=("train.jsonl", io.BytesIO(data), "application/jsonl"), purpose="fine-tune")
    assert f.object == "file" and f.bytes == len(data) and f.purpose == "fine-tune"
    assert [x.id for x in oc.files.list()] == [f.id]
    assert oc.files.retrieve(f.id).filename == "train.jsonl"
    assert oc.files.content(f.id).read() == data
    up = oc.uploads.create(bytes=10, filename="a.jsonl", mime_type="application/jsonl", purpose="fine-tune")
    part = oc.uploads.parts.create(up.id, data=b"0123456789")
    done = oc.uploads.complete(up.id, part_ids=[part.id], md5=hashlib.md5(b"0123456789").hexdigest())
    assert done.status == "completed" and done.file is not None and done.file.bytes == 10
    assert oc.files.delete(f.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        oc.files.retrieve(f.id)
    with pytest.raises(openai.UnprocessableEntityError):
        oc.files.create(file=("x.jsonl", io.BytesIO(b"x"), "application/jsonl"), purpose="nonsense")  # type: ignore[arg-type]


def test_an_upload_body_over_the_limit_is_refused_as_it_streams(sqlite_world: World) -> None:
    """api/limits.py streams upload bodies: over RELAX_MAX_UPLOAD_BODY_BYTES, 413 from Content-Length, or as soon
    as the bytes of a chunked body pass it; nothing is kept."""
    w = sqlite_world
    w.settings.api.max_upload_body_bytes = 4096
    r = upload(w, "alpha", "a.jsonl", b"x" * 10_000)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request.too_large"
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ndataset\r\n--{boundary}\r\n'
            f'Content-Disposition: form-data; name="file"; filename="a.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
        ).encode()
        + b"x" * 10_000
        + f"\r\n--{boundary}--\r\n".encode()
    )
    chunks = (body[i : i + 1000] for i in range(0, len(body), 1000))  # no Content-Length: chunked
    r = w.client.post(
        "/v1/files",
        content=chunks,
        headers={**w.as_("alpha"), "Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request.too_large"
    assert _files_on_disk(w, "alpha") == []
    assert upload(w, "alpha", "small.jsonl", b"x" * 100).status_code == 200  # under the limit: taken


def test_zip_archives_with_links_or_traversal_are_refused(sqlite_world: World) -> None:
    w = sqlite_world

    def zipped(name: str, mode: int | None = None) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.external_attr = mode << 16
            zf.writestr(info, "/etc/passwd" if mode else "x")
        return buf.getvalue()

    for what, blob in {
        "symlink": zipped("model/link", 0o120777),
        "traversal": zipped("../../escape"),
        "absolute": zipped("/tmp/escape"),
        "backslash": zipped("..\\..\\escape"),
    }.items():
        r = upload(w, "alpha", "m.zip", blob, purpose="model", ctype="application/zip")
        assert r.status_code == 422, (what, r.text)
        assert r.json()["error"]["code"] == "file.bad_archive", what
    assert _files_on_disk(w, "alpha") == []


def test_links_planted_in_the_area_by_a_job_reach_nothing(sqlite_world: World, tmp_path: Path) -> None:
    """A team's jobs write in its area, files/ included: a link planted there never makes the API read or write
    outside it (a part swapped for a link to a secret, a stored file swapped, the staging folder swapped)."""
    w = sqlite_world
    h = w.as_("alpha")
    secret = w.settings.home / "secret.key"
    secret.write_text("s" * 10)
    files_dir = w.area("alpha") / "files"

    # a part replaced by a link to a platform secret of the same size: completing refuses it
    up = w.client.post(
        "/v1/uploads",
        json={"filename": "m.bin", "purpose": "model", "bytes": 10, "mime_type": "application/octet-stream"},
        headers=h,
    ).json()
    pid = w.client.post(
        f"/v1/uploads/{up['id']}/parts", files={"data": ("b", b"0123456789")}, headers=h
    ).json()["id"]
    part = files_dir / ".uploads" / up["id"] / pid
    part.unlink()
    part.symlink_to(secret)
    r = w.client.post(f"/v1/uploads/{up['id']}/complete", json={"part_ids": [pid]}, headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "upload.part_changed", r.text
    # sending the part again lays it anew (the same id), and the upload completes with the bytes sent
    again = w.client.post(f"/v1/uploads/{up['id']}/parts", files={"data": ("b", b"0123456789")}, headers=h)
    assert again.json()["id"] == pid and not part.is_symlink()
    done = w.client.post(f"/v1/uploads/{up['id']}/complete", json={"part_ids": [pid]}, headers=h).json()
    assert w.client.get(f"/v1/files/{done['file']['id']}/content", headers=h).content == b"0123456789"

    # a stored file replaced by a link: its content is refused, not the link's target served
    f = upload(w, "alpha", "d.jsonl", b"{}\n").json()
    stored = files_dir / f["id"] / "d.jsonl"
    stored.unlink()
    stored.symlink_to(secret)
    r = w.client.get(f"/v1/files/{f['id']}/content", headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "file.store_link" and "s" * 10 not in r.text

    # the staging folder replaced by a link elsewhere: nothing is written there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (files_dir / ".staging").rename(tmp_path / "old-staging")
    (files_dir / ".staging").symlink_to(elsewhere)
    r = upload(w, "alpha", "e.jsonl", b"{}\n")
    assert r.status_code == 409 and r.json()["error"]["code"] == "file.store_link"
    assert list(elsewhere.iterdir()) == []


def test_sdk_sends_a_part_again_when_its_answer_is_lost(
    sqlite_world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part the server stored whose answer never came back (the connection dropped) is sent again: the server
    answers the same part, and the upload completes with the file's bytes once."""
    import httpx

    import client.files as client_files
    from client.sdk import RelaxClient

    w = sqlite_world
    c = RelaxClient("http://testserver", "unused")
    c._http = w.client
    w.client.headers.update(w.as_("alpha"))
    real = w.client.request
    dropped: list[str] = []

    def flaky(method: str, url: str, **kw):  # type: ignore[no-untyped-def]
        resp = real(method, url, **kw)
        if str(url).endswith("/parts") and len(dropped) < 2:
            dropped.append(resp.json()["id"])
            raise httpx.ReadError(
                "connection reset", request=httpx.Request(method, f"http://testserver{url}")
            )
        return resp

    monkeypatch.setattr(w.client, "request", flaky)
    monkeypatch.setattr(client_files.time, "sleep", lambda s: None)
    blob = bytes(range(256)) * 200
    (tmp_path / "w.bin").write_bytes(blob)
    f = c.files.upload(tmp_path / "w.bin", purpose="model", part_bytes=20_000, threshold=30_000)
    assert f["bytes"] == len(blob) and dropped[0] == dropped[1]  # the same part, stored once
    assert w.client.get(f"/v1/files/{f['id']}/content").content == blob
