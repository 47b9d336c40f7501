# Stand-in for nginx:1.27-alpine: Debian bookworm's nginx (1.22), reading /etc/nginx/conf.d/*.conf as the
# official image does, its logs to the container's output, and wget for health checks.
ARG BASE=debian:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends nginx-light wget \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/* \
    && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
