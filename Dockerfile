# Production image of the platform's control plane: API, scheduler beat, pool workers.
# The pipeline itself runs on the Ray clusters (their image needs the `runtime` extra).
#   docker build -t relax-platform .
#   docker run -e RELAX_DATABASE_URL=postgresql+psycopg://relax@db/relax \
#              -e RELAX_BROKER_URL=redis://redis:6379/0 -e RELAX_SECRET_KEY=... \
#              -e RELAX_ARTIFACT_ROOT=/shared/artifacts -p 8400:8400 relax-platform api
#   ... relax-platform scheduler            # beat + scheduling passes
#   ... -e RELAX_RAY_ADDRESS=http://ray-head:8265 relax-platform worker local   # one per pool
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY api ./api
COPY scheduler ./scheduler
COPY runtime ./runtime
COPY jobspec ./jobspec
COPY client ./client
COPY migrations ./migrations
COPY bench ./bench
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    RELAX_ENVIRONMENT=production \
    RELAX_HOME=/var/lib/relax \
    RELAX_HOST=0.0.0.0 \
    RAY_USAGE_STATS_ENABLED=0
RUN useradd --create-home --uid 10001 relax && mkdir -p /var/lib/relax && chown relax /var/lib/relax
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY docker/entrypoint.sh /usr/local/bin/relax-entrypoint
USER relax
EXPOSE 8400
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request,os;urllib.request.urlopen('http://127.0.0.1:'+os.environ.get('RELAX_PORT','8400')+'/healthz')"
ENTRYPOINT ["relax-entrypoint"]
CMD ["api"]
