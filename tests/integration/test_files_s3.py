"""The S3 file store against a real S3 server started here (moto's server mode on 127.0.0.1, a free port; no
in-process mock): uploads whole and in parts land in the bucket under the prefix, downloads stream with Range,
a model archive is unpacked into the team's cache when a job names it by `file://<id>`, and a delete removes the
object."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.db.models import Job
from scheduler.settings import FileSettings
from tests.dbclone import migrated_sqlite
from tests.factories import grpo_spec
from tests.integration.test_files import World, make_world, upload

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture
def s3() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    ).create_bucket(Bucket="relax-files")
    yield url
    server.stop()


@pytest.fixture
def world(s3: str, tmp_path: Path) -> Iterator[World]:
    url = migrated_sqlite(tmp_path / "relax.db")  # a copy of one `upgrade()` migrated
    files = FileSettings(
        store="s3",
        s3_endpoint_url=s3,
        s3_bucket="relax-files",
        s3_prefix="team-files",
        s3_region="us-east-1",
        s3_access_key_id="k",
        s3_secret_access_key="s",
        team_quota_bytes=1_000_000,
        max_file_bytes=100_000,
        max_part_bytes=40_000,
    )
    w = make_world(url, tmp_path, files)
    with w.client:
        yield w
    w.db.dispose()


def _objects(w: World) -> list[str]:
    f = w.settings.files
    c = boto3.client(
        "s3",
        endpoint_url=f.s3_endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )
    return sorted(o["Key"] for o in c.list_objects_v2(Bucket="relax-files").get("Contents", []))


def test_s3_store_end_to_end(world: World) -> None:
    w = world
    h = w.as_("alpha")
    data = b'{"prompt": "1+1", "label": "2"}\n' * 50
    f = upload(w, "alpha", "train.jsonl", data).json()
    assert _objects(w) == [f"team-files/teams/{w.teams['alpha']}/files/{f['id']}/train.jsonl"]
    assert not (w.area("alpha") / "files" / f["id"]).exists()  # the bytes are in the bucket only
    got = w.client.get(f"/v1/files/{f['id']}/content", headers=h)
    assert got.status_code == 200 and got.content == data
    part = w.client.get(f"/v1/files/{f['id']}/content", headers={**h, "Range": "bytes=5-14"})
    assert part.status_code == 206 and part.content == data[5:15]
    assert part.headers["content-range"] == f"bytes 5-14/{len(data)}"
    r = w.client.get(f"/v1/files/{f['id']}/content", headers={**h, "Range": f"bytes={len(data)}-"})
    assert r.status_code == 416

    # a model folder in parts: a tar archive
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, blob in (("tiny/config.json", b"{}"), ("tiny/weights.bin", bytes(range(256)) * 300)):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    archive = buf.getvalue()
    up = w.client.post(
        "/v1/uploads",
        json={
            "filename": "tiny.tar",
            "purpose": "model",
            "bytes": len(archive),
            "mime_type": "application/x-tar",
        },
        headers=h,
    ).json()
    ids = [
        w.client.post(
            f"/v1/uploads/{up['id']}/parts", files={"data": ("b", archive[i : i + 40_000])}, headers=h
        ).json()["id"]
        for i in range(0, len(archive), 40_000)
    ]
    done = w.client.post(f"/v1/uploads/{up['id']}/complete", json={"part_ids": ids}, headers=h)
    assert done.status_code == 200, done.text
    mid = done.json()["file"]["id"]
    assert done.json()["file"]["kind"] == "folder"

    # a job names both: the model is materialised (unpacked) into the team's cache before it runs
    spec = grpo_spec(**{"hf-checkpoint": f"file://{mid}", "prompt-data": f"file://{f['id']}"})
    r = w.client.post("/v1/jobs", json={"spec": spec, "queue": "alpha-q"}, headers=h)
    assert r.status_code == 201, r.text
    cache = (w.area("alpha") / "files" / "cache").resolve()
    with w.db.session(read_only=True) as s:
        job = s.get(Job, r.json()["id"])
        assert job.spec["hf_checkpoint"] == str(cache / mid / "model" / "tiny")
        assert job.spec["prompt_data"] == str(cache / f["id"] / "train.jsonl")
    assert (cache / mid / "model" / "tiny" / "weights.bin").read_bytes() == bytes(range(256)) * 300
    assert (cache / f["id"] / "train.jsonl").read_bytes() == data

    # delete: the object and the cached copy go
    assert w.client.delete(f"/v1/files/{f['id']}", headers=h).status_code == 200
    assert _objects(w) == [f"team-files/teams/{w.teams['alpha']}/files/{mid}/tiny.tar"]
    assert not (cache / f["id"]).exists()
