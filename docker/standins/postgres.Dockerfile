# Stand-in for postgres:16-alpine: Debian bookworm's PostgreSQL 15 (the platform needs >= 14), with the official
# image's contract: POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB create the role and database on the first
# start, the data lives in /var/lib/postgresql/data, password authentication from other hosts, pg_isready.
ARG BASE=debian:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["sh", "/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
