"""Routes of a team's files (`/v1/files`) and uploads in parts (`/v1/uploads`), in OpenAI's Files and Uploads
APIs' shapes (docs/reference/files.md). Bytes arrive as multipart/form-data, streamed to disk (api/limits.py
does not hold them in memory), and leave streamed, with HTTP Range honoured."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.deps import AuditDep, PrincipalDep, SessionDep
from api.schemas import ERROR_RESPONSES, ErrorEnvelope
from api.schemas.files import (
    FileDeleted,
    FilePublic,
    FilesPage,
    UploadComplete,
    UploadCreate,
    UploadPartPublic,
    UploadPublic,
)
from jobspec.issues import SpecIssue
from scheduler.db.models import StoredFile
from scheduler.domain.errors import InvalidRequest, NotFound
from scheduler.services.files import PURPOSES, WRITE, Files, UnsupportedType, byte_range
from scheduler.services.filestore import store_for

_UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {
        "model": ErrorEnvelope,
        "description": "Over the team's quota, or the file (the part) is too large.",
    },
    415: {"model": ErrorEnvelope, "description": "Not multipart/form-data, or a content type not taken."},
}

router = APIRouter(prefix="/v1/files", tags=["files"], responses=ERROR_RESPONSES)
uploads_router = APIRouter(prefix="/v1/uploads", tags=["files"], responses=ERROR_RESPONSES)


def _files(request: Request, session: Any) -> Files:
    state = request.app.state
    store = getattr(state, "file_store", None)
    if store is None:
        store = state.file_store = store_for(state.settings.files, state.artifact_root)
    return Files(session, settings=state.settings.files, artifact_root=state.artifact_root, store=store)


def _multipart(fields: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {"type": "object", "properties": fields, "required": required}
                }
            },
        }
    }


async def _form(
    request: Request, file_field: str, text_fields: tuple[str, ...]
) -> tuple[UploadFile, dict[str, str]]:
    """The multipart body's file and text fields: 415 when the body is not multipart/form-data, 422 naming a
    missing field."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "multipart/form-data":
        raise UnsupportedType(
            f"the body is {ctype or 'untyped'}, not multipart/form-data",
            code="request.unsupported_media_type",
            issues=[
                SpecIssue(
                    "request.unsupported_media_type",
                    "body",
                    "not multipart/form-data",
                    f"send a multipart form with the bytes in `{file_field}` "
                    "(curl -F file=@model.tar -F purpose=model)",
                )
            ],
        )
    form = await request.form(max_files=1, max_fields=10)
    upload = form.get(file_field)
    if not isinstance(upload, UploadFile):
        raise InvalidRequest(
            f"{file_field}: no file in the form",
            issues=[
                SpecIssue(
                    InvalidRequest.code,
                    file_field,
                    "missing (or not a file)",
                    f"send the bytes as the form's file field `{file_field}`",
                )
            ],
        )
    texts = {k: v for k in text_fields if isinstance(v := form.get(k), str)}
    return upload, texts


@router.post(
    "",
    status_code=200,
    response_model=FilePublic,
    responses=_UPLOAD_ERRORS,
    openapi_extra=_multipart(
        {
            "file": {"type": "string", "format": "binary", "description": "The file's bytes."},
            "purpose": {"type": "string", "enum": list(PURPOSES)},
            "team": {"type": "string", "description": "Admins: the team (name or id)."},
        },
        ["file", "purpose"],
    ),
)
async def create_file(
    request: Request, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> FilePublic:
    """Upload a file whole (up to RELAX_FILES_MAX_FILE_BYTES; larger ones through /v1/uploads). Purpose `model`
    with a .tar, .tar.gz, .tgz or .zip archive: the folder inside is unpacked, and `file://<id>` names it."""
    principal.require(WRITE)  # before its body is read
    upload, texts = await _form(request, "file", ("purpose", "team"))
    if "purpose" not in texts:
        raise InvalidRequest(
            "purpose: missing",
            issues=[SpecIssue("file.bad_purpose", "purpose", "missing", f"one of {', '.join(PURPOSES)}")],
        )
    audit.note(purpose=texts["purpose"][:40])

    def work() -> FilePublic:
        try:
            row = _files(request, session).create(
                principal,
                upload.file,
                filename=upload.filename,
                purpose=texts["purpose"],
                content_type=upload.content_type,
                team=texts.get("team"),
            )
        finally:
            upload.file.close()
        audit.note(target=row.id, team=row.team_id, bytes=row.bytes)
        return FilePublic.of(row)

    return await run_in_threadpool(work)


@router.get("", response_model=FilesPage)
def list_files(
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    purpose: Annotated[str | None, Query(max_length=40)] = None,
    team: Annotated[str | None, Query(max_length=100, description="Admins: only this team's.")] = None,
    after: Annotated[
        str | None, Query(max_length=40, description="Id of the last file of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 50,
    order: Literal["asc", "desc"] = "desc",
) -> FilesPage:
    """The team's files, newest first (an admin: every team's)."""
    rows, cursor = _files(request, session).list(
        principal, purpose=purpose, team=team, after=after, limit=limit, order=order
    )
    return FilesPage(
        data=[FilePublic.of(r) for r in rows],
        first_id=rows[0].id if rows else None,
        last_id=rows[-1].id if rows else None,
        has_more=cursor is not None,
        next_cursor=cursor,
    )


@router.get("/{file_id}", response_model=FilePublic)
def get_file(file_id: str, request: Request, session: SessionDep, principal: PrincipalDep) -> FilePublic:
    return FilePublic.of(_files(request, session).get(principal, file_id))


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(
    file_id: str, request: Request, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> FileDeleted:
    """Remove a file and its bytes (its unpacked folder, its cached copy) from the store."""
    row = _files(request, session).delete(principal, file_id)
    audit.note(team=row.team_id)
    return FileDeleted(id=row.id)


@router.get(
    "/{file_id}/content",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes."},
        206: {
            "content": {"application/octet-stream": {}},
            "description": "The bytes of the Range asked for.",
        },
        416: {"model": ErrorEnvelope, "description": "A Range that is malformed or past the end."},
    },
)
def file_content(
    file_id: str,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    range_: Annotated[str | None, Header(alias="range", max_length=200)] = None,
) -> Response:
    """The file's bytes, streamed; a `Range: bytes=START-END` answers 206 with those bytes (resume a download)."""
    svc = _files(request, session)
    row = svc.get(principal, file_id)
    return _content(svc, row, range_)


def _content(svc: Files, row: StoredFile, range_header: str | None) -> Response:
    store = svc.store
    if store.name != row.store:
        store = store_for(svc.settings, svc.artifact_root)
    size = row.bytes
    asked = byte_range(range_header, size)  # 416 before anything is sent
    local = store.local_path(row.key)
    if local is not None and not local.is_file():
        raise NotFound(
            f"the bytes of file {row.id} are gone from the store",
            code="file.content_missing",
            details={"hint": "upload it again (something removed files/ in your team's area)"},
        )
    headers = {"Accept-Ranges": "bytes", "ETag": f'"{row.sha256}"'}
    if local is not None:
        # FileResponse answers Range itself (206, Content-Range), as it does for a job's artifacts
        return FileResponse(local, media_type=row.content_type, filename=row.filename, headers=headers)
    start, end = asked or (0, size)
    headers["Content-Length"] = str(end - start)
    headers["Content-Disposition"] = FileResponse(__file__, filename=row.filename).headers[
        "content-disposition"
    ]
    if asked is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return StreamingResponse(
        store.read(row.key, start, end),
        status_code=206 if asked else 200,
        media_type=row.content_type,
        headers=headers,
    )


# Uploads in parts ------------------------------------------------------------------------------------------
@uploads_router.post("", status_code=200, response_model=UploadPublic, responses=_UPLOAD_ERRORS)
def create_upload(
    body: UploadCreate, request: Request, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> UploadPublic:
    """Start an upload of `bytes` bytes in parts (for files over RELAX_FILES_MAX_FILE_BYTES): add the parts,
    then complete it with their ids in order. It expires after RELAX_FILES_UPLOAD_EXPIRY_SECONDS."""
    audit.note(purpose=body.purpose[:40], bytes=body.bytes)
    row = _files(request, session).create_upload(
        principal,
        filename=body.filename,
        purpose=body.purpose,
        size=body.bytes,
        mime_type=body.mime_type,
        team=body.team,
    )
    audit.note(target=row.id, team=row.team_id)
    return UploadPublic.of(row)


@uploads_router.post(
    "/{upload_id}/parts",
    status_code=200,
    response_model=UploadPartPublic,
    responses=_UPLOAD_ERRORS,
    openapi_extra=_multipart(
        {"data": {"type": "string", "format": "binary", "description": "The part's bytes."}}, ["data"]
    ),
)
async def add_upload_part(
    upload_id: str, request: Request, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> UploadPartPublic:
    """One part (up to RELAX_FILES_MAX_PART_BYTES). The same bytes sent again answer the same part: a part
    whose answer was lost can be sent again."""
    # the key and the upload first: the body is read only for an upload the key may add to
    svc = _files(request, session)
    await run_in_threadpool(lambda: svc.get_upload(principal, upload_id, write=True))
    data, _ = await _form(request, "data", ())

    def work() -> UploadPartPublic:
        try:
            part = svc.add_part(principal, upload_id, data.file)
        finally:
            data.file.close()
        audit.note(part=part.id, bytes=part.bytes)
        return UploadPartPublic.of(part)

    return await run_in_threadpool(work)


@uploads_router.post(
    "/{upload_id}/complete", status_code=200, response_model=UploadPublic, responses=_UPLOAD_ERRORS
)
def complete_upload(
    upload_id: str,
    body: UploadComplete,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    audit: AuditDep,
) -> UploadPublic:
    """The parts, in the order of `part_ids`, become the file (checked against `md5` when given)."""
    upload, file = _files(request, session).complete_upload(
        principal, upload_id, part_ids=body.part_ids, md5=body.md5
    )
    audit.note(team=upload.team_id, file=file.id, bytes=file.bytes)
    return UploadPublic.of(upload, file)


@uploads_router.post("/{upload_id}/cancel", status_code=200, response_model=UploadPublic)
def cancel_upload(
    upload_id: str, request: Request, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> UploadPublic:
    """Drop a pending upload and its parts."""
    upload = _files(request, session).cancel_upload(principal, upload_id)
    audit.note(team=upload.team_id)
    return UploadPublic.of(upload)


@uploads_router.get("/{upload_id}", response_model=UploadPublic)
def get_upload(
    upload_id: str, request: Request, session: SessionDep, principal: PrincipalDep
) -> UploadPublic:
    """An upload's state (and its file once completed)."""
    svc = _files(request, session)
    upload = svc.get_upload(principal, upload_id)
    file = session.get(StoredFile, upload.file_id) if upload.file_id else None
    return UploadPublic.of(upload, file)
