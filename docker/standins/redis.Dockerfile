# Stand-in for redis:7-alpine: Debian bookworm's Redis 7.0. Like the official image, a redis-server started
# without a configuration file accepts connections from other containers (protected mode off) and keeps /data.
ARG BASE=debian:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["sh", "/usr/local/bin/docker-entrypoint.sh"]
CMD ["redis-server"]
