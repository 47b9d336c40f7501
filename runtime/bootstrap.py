"""The driver's credential: the one-time bootstrap secret of its Ray job's environment, exchanged for its
attempt's bearer token as the very first thing the Ray job does.

`python -m runtime.bootstrap --job-id ID --api-url URL` is the Ray job's entrypoint (runtime/launcher.py):
it imports only httpx (well under a second) so that the exchange happens before the ten seconds the
driver's own imports take, leaving the bootstrap secret, which Ray's Jobs API shows to anyone who can
read the cluster's dashboard, valid for as short a time as possible; then it runs the driver with the
token handed over in-process. The token lives in this process's memory only: never in `os.environ`,
on a command line, in a log line or in a Ray actor's arguments. Design: scheduler/services/job_tokens.py.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys

from runtime.credential import CredentialError, exchange, take_bootstrap_secret
from runtime.redaction import install_log_redaction

log = logging.getLogger("runtime.bootstrap")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m runtime.bootstrap", add_help=False)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--api-url", required=True)
    known, _ = parser.parse_known_args(argv)
    install_log_redaction()
    try:
        credential = exchange(known.api_url, known.job_id, take_bootstrap_secret())
    except CredentialError as exc:
        log.error("job %s: %s", known.job_id, exc)
        return 1
    from runtime import driver  # the heavy imports (torch, ray, transformers) only now

    return driver.main(argv, credential=credential)


if __name__ == "__main__":
    code = main()
    gc.freeze()  # no last garbage collection at exit, as runtime.driver.exit_process says (~1 s less)
    sys.exit(code)
