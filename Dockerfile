# Images of the platform (docs/deploy.md; compose.yaml runs them all):
#   target `platform` (the default): the control plane (API with the dashboard, scheduler beat, pool workers)
#   target `ray`: a Ray cluster's node for the pipeline itself: the platform plus its `runtime` extra (torch, ...)
#   docker build -t relax-platform .                 docker build --target ray -t relax-ray .
#   docker run -e RELAX_DATABASE_URL=postgresql+psycopg://relax@db/relax \
#              -e RELAX_BROKER_URL=redis://redis:6379/0 -e RELAX_SECRET_KEY=... \
#              -e RELAX_ARTIFACT_ROOT=/shared/artifacts -p 8400:8400 relax-platform api
#   ... relax-platform scheduler            # beat + scheduling passes
#   ... -e RELAX_RAY_ADDRESS=http://ray-head:8265 relax-platform worker local   # one per pool
#   ... relax-ray ray-head | ray-worker     # docker/entrypoint.sh lists every role

# The dashboard (web/dist), which the API serves at / when it is there (api/app.py::WEB_DIST)
FROM node:20-slim AS web
WORKDIR /src/web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY web ./
# the Submit page's example spec is read from ../examples at build time
COPY examples /src/examples
RUN npm run build

FROM python:3.11-slim AS build
WORKDIR /src
# wheels offered ahead of the index (docker/wheelhouse/README.md); empty by default
COPY docker/wheelhouse /wheelhouse
ENV PIP_FIND_LINKS=/wheelhouse
COPY pyproject.toml README.md alembic.ini ./
COPY api ./api
COPY scheduler ./scheduler
COPY runtime ./runtime
COPY jobspec ./jobspec
COPY client ./client
COPY wire ./wire
COPY migrations ./migrations
COPY bench ./bench
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim AS control-plane
ENV PYTHONUNBUFFERED=1 \
    RELAX_ENVIRONMENT=production \
    RELAX_HOME=/var/lib/relax \
    RELAX_HOST=0.0.0.0 \
    RAY_USAGE_STATS_ENABLED=0
RUN useradd --create-home --uid 10001 relax && mkdir -p /var/lib/relax && chown relax /var/lib/relax
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# api/app.py serves <site-packages>/web/dist: the built dashboard, linked there
COPY --from=web /src/web/dist /opt/relax/web/dist
RUN ln -s /opt/relax/web "$(python -c 'import api, pathlib; print(pathlib.Path(api.__file__).resolve().parents[1])')/web"
COPY docker/entrypoint.sh /usr/local/bin/relax-entrypoint
COPY docker/register_pool.py /usr/local/bin/register_pool.py
USER relax
EXPOSE 8400
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request,os;urllib.request.urlopen('http://127.0.0.1:'+os.environ.get('RELAX_PORT','8400')+'/healthz')"
ENTRYPOINT ["relax-entrypoint"]
CMD ["api"]

# A Ray node (head or worker): the drivers and the pipeline's roles run here, so the `runtime` extra too. Its
# torch pin (pyproject.toml) takes PyPI's default Linux build of that version (with CUDA), or a wheel of it put in
# docker/wheelhouse (torch's CPU build for CPU-only nodes).
FROM control-plane AS ray
USER root
COPY --from=build /wheels /wheels
COPY --from=build /wheelhouse /wheelhouse
RUN PIP_FIND_LINKS=/wheelhouse pip install --no-cache-dir "$(ls /wheels/relax_platform-*.whl)[runtime]" \
    && rm -rf /wheels /wheelhouse
USER relax
EXPOSE 6379 8265
HEALTHCHECK NONE
CMD ["ray-head"]

# The default target is the last stage: the control plane, as `docker build .` gives it
FROM control-plane AS platform
