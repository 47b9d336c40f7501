"""Resolve and validate a folder of Relax launch scripts, as `relaxctl spec validate` would, offline.

    python -m tools.check_launch_scripts DIR [--glob 'run*.sh'] [--env K=V ...] [--json]

For a checkout of public Relax scripts (not part of this repository): every script matching the glob is
resolved by bash on this machine (client/launch_script.py), its argv normalized by the job spec
(jobspec.normalize) and checked against what its training backend runs (runtime.capabilities: the
submission's spec.unsupported_by_backend), without a server. Prints one line per script and a table of the reasons scripts
fail, most frequent first. Exit status 1 when any script fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from client.launch_script import LaunchScriptError, resolve_launch_script
from jobspec import FIELDS, SpecError, normalize
from runtime.capabilities import unsupported_parameters


def check(path: Path, env: dict[str, str]) -> dict:
    try:
        resolved = resolve_launch_script(path, env=env)
    except LaunchScriptError as err:
        return {"script": str(path), "ok": False, "stage": "resolve", "reasons": [str(err).splitlines()[0]]}
    try:
        res = normalize(argv=resolved.argv)
    except SpecError as err:
        reasons = [f"{i.code} --{i.field}" if i.field else i.code for i in err.errors]
        return {"script": str(path), "ok": False, "stage": "spec", "reasons": reasons}
    # what submission refuses next: parameters the job's training backend does not run (spec.unsupported_by_backend)
    values = res.spec.to_dict()
    defaults = {name: getattr(f, "default", None) for name, f in FIELDS.items()}
    refused = unsupported_parameters(values, defaults)
    if refused:
        backend = values.get("train_backend")
        reasons = [f"spec.unsupported_by_backend ({backend}) --{item.replace('_', '-')}" for item in refused]
        return {"script": str(path), "ok": False, "stage": "backend", "reasons": reasons}
    return {
        "script": str(path),
        "ok": True,
        "stage": "valid",
        "reasons": [],
        "warnings": [f"{w.code} --{w.field}" for w in res.warnings],
        "flags": sum(1 for a in resolved.argv if a.startswith("--")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--glob", default="run*.sh")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every script")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    results = [check(p, env) for p in sorted(args.folder.rglob(args.glob)) if p.is_file()]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            mark = "ok  " if r["ok"] else f"FAIL ({r['stage']})"
            print(f"{mark:15} {r['script']}" + ("" if r["ok"] else "  " + "; ".join(r["reasons"])[:300]))
        reasons = collections.Counter(reason for r in results for reason in r["reasons"])
        ok = sum(r["ok"] for r in results)
        print(f"\n{ok}/{len(results)} scripts valid")
        if reasons:
            print("\n| count | reason |\n|---|---|")
            for reason, count in reasons.most_common():
                print(f"| {count} | {reason[:160]} |")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
