# Stand-in for python:3.11-slim: Debian bookworm's own Python 3.11 in a venv on /usr/local/bin's PATH, as the
# official image has `python` and `pip` there (pip may install system-wide, which Debian's python3 refuses).
ARG BASE=debian:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/python \
    && for b in python python3 pip pip3; do ln -s /opt/python/bin/$b /usr/local/bin/$b; done
ENV PATH=/opt/python/bin:$PATH LANG=C.UTF-8
CMD ["python3"]
