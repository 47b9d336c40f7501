"""Relax launch scripts, resolved by bash itself on the client (docs/adr/0004).

A launch script is run by the real `bash` in a scratch environment where `python`, `python3`,
`python3.N`, `ray` and `torchrun` capture their argv instead of running anything, and where the
commands that would change the user's machine (pkill, rm, mkdir, git, pip, curl, ulimit, ...) do nothing.
Everything else (`source`d model files, arrays, `$(...)`, branches on the environment, heredocs)
behaves exactly as it does for the user, so the training command's argv is the one bash would
really pass. The server never runs a shell: it receives that argv.

    res = resolve_launch_script("scripts/run-qwen3-4B.sh", env={"MODEL_DIR": "/models"}, script_args=[])
    res.argv        # the Relax flags of the training command
    res.file, res.line, res.entrypoint, res.runtime_env, res.skipped

The environment of the script is a clean minimal one: PATH (the capture stubs first, then the
caller's PATH), a scratch HOME and TMPDIR (removed afterwards), LANG, plus the `env` pairs; the
caller's other variables are not visible unless `inherit_env=True`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Call",
    "LaunchScriptError",
    "ResolvedScript",
    "is_secret_name",
    "redact_env",
    "resolve_launch_script",
]

TEXT_CAP = 256 * 1024
DEFAULT_TIMEOUT_S = 30.0
_STDERR_TAIL = 12
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Commands that capture their argv. python3.N covers the interpreters scripts name explicitly.
PYTHON_NAMES = ("python", "python2", "python3", *(f"python3.{n}" for n in range(6, 16)))
CAPTURED = (*PYTHON_NAMES, "ray", "torchrun")
# Commands with side effects on the user's machine: they do nothing and succeed, except
# nvidia-smi (prints nothing and fails, as on a machine without GPUs) and tee (passes its input
# through, writes no file).
NEUTRALISED = (
    "pkill",
    "kill",
    "killall",
    "nvidia-smi",
    "sleep",
    "rm",
    "mkdir",
    "cp",
    "mv",
    "ln",
    "touch",
    "chmod",
    "tee",
    "wget",
    "curl",
    "git",
    "pip",
    "pip3",
    "uv",
    "apt-get",
    "sudo",
    "docker",
    "ssh",
    "scp",
    "rsync",
    "huggingface-cli",
    "hf",
    "modelscope",
    # `ulimit -n 65535` at the top of Relax's NPU scripts: raising a limit past the hard one fails without
    # privileges (under `set -e` the script stops there), and it changes nothing the training command reads
    "ulimit",
)
_FAILING = {"nvidia-smi": 1}

TRAIN_SCRIPTS = frozenset({"train.py", "train_async.py"})
_TORCH_LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_TORCHRUN_SWITCHES = frozenset(
    {
        "--standalone",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "-m",
        "--module",
        "--use-env",
        "--use_env",
    }
)
_SECRET_RE = re.compile(r"key|token(?!s|izer)|secret|passw(?:or)?d|credential", re.IGNORECASE)
_ASSIGN_RE = re.compile(r"^(\s*(?:export\s+|declare\s+-x\s+)?([A-Za-z_][A-Za-z0-9_]*)=)(\S.*)$", re.MULTILINE)
_BASH_ERROR_RE = re.compile(r"^(?P<file>.+?): line (?P<line>\d+): (?P<msg>.*)$")
_REDIRECT_FAILED_RE = re.compile(r"^.+?: line \d+: .+: (No such file or directory|Read-only file system)$")
# the prelude's own names (__relax_rec, __RELAX_FILE …), not a path such as ".../redai-studio__Relax/..."
_MACHINERY_RE = re.compile(r"(?<![\w/.-])__(relax|RELAX)_")
_XTRACE_RE = re.compile(r"^\++ ")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables a caller's environment must not hand to the script even with inherit_env.
_NEVER_INHERITED = (
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "CDPATH",
    "PROMPT_COMMAND",
    "GLOBIGNORE",
    "IFS",
)


class LaunchScriptError(Exception):
    """The script could not be resolved to one training command; nothing is submitted.

    `code` is one of: not_found, unreadable, bad_env, syntax, reads_stdin, timeout, exited,
    no_training_command, several_training_commands, scratch_path, no_bash.
    """

    def __init__(
        self,
        code: str,
        path: str,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        details: Sequence[str] = (),
    ) -> None:
        self.code, self.path, self.file, self.line = code, path, file, line
        self.message, self.details = message, list(details)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file or self.path
        if self.line:
            where = f"{where}:{self.line}"
        text = f"{where}: {self.message}"
        return text + "".join(f"\n  {d}" for d in self.details)


@dataclass(frozen=True)
class Call:
    """One captured or neutralised command: its words as bash passed them, where it ran."""

    argv: list[str]
    file: str
    line: int
    via: str  # "function" (a shell function) or "PATH" (a stub executable: exec, env, timeout, sh …)
    kind: str  # "python", "torchrun", "ray" or "neutralised"
    what: str = ""  # for display: "python3 -m x", "python3 - (heredoc)", "ray start", ...

    def where(self) -> str:
        return f"{display_path(self.file)}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ResolvedScript:
    """The training command a launch script reaches, and where it came from."""

    path: str
    text: str
    text_truncated: bool
    sha256: str
    env: dict[str, str]  # the given pairs, secret-looking values replaced by "***"
    script_args: list[str]
    argv: list[str]  # the Relax flags: what follows the training module or script
    command: list[str]  # the whole captured command (e.g. ray job submit … -- python3 -m …)
    entrypoint: str  # e.g. "python3 -m relax.entrypoints.train"
    launcher: str  # "python", "torchrun" or "ray job submit"
    file: str
    line: int
    runtime_env: dict[str, Any] | None = None
    runtime_env_path: str | None = None
    working_dir: str | None = None
    submission_id: str | None = None
    calls: list[Call] = field(default_factory=list)  # python/ray/torchrun calls in order, training included
    training_index: int = 0  # which of `calls` is the training command
    neutralised: list[Call] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    isolated: bool = False
    inherit_env: bool = False
    exit_status: int | None = None
    seconds: float = 0.0

    @property
    def job_name(self) -> str:
        """A job name the API accepts, from the script's file name."""
        stem = Path(self.path).stem
        return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).lstrip("._-")[:100] or "launch-script"

    @property
    def skipped(self) -> list[Call]:
        """Every python, ray and torchrun call that is not the training command (not run)."""
        return [c for i, c in enumerate(self.calls) if i != self.training_index]

    def provenance(self) -> dict[str, Any]:
        """What the job keeps (`launch_script` of the API request; see api/schemas/jobs.py)."""
        return {
            "path": self.path,
            "sha256": self.sha256,
            "text": self.text,
            "text_truncated": self.text_truncated,
            "env": dict(self.env),
            "script_args": list(self.script_args),
            "file": self.file,
            "line": self.line,
            "entrypoint": self.entrypoint,
            "launcher": self.launcher,
            "runtime_env": self.runtime_env,
            "working_dir": self.working_dir,
            "submission_id": self.submission_id,
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, for `--json` output (the text is left out: it is in the file)."""
        out = self.provenance()
        out.pop("text")
        out.update(
            argv=self.argv,
            command=self.command,
            runtime_env_path=self.runtime_env_path,
            skipped=[c.to_dict() for c in self.skipped],
            neutralised=[c.to_dict() for c in self.neutralised],
            notes=list(self.notes),
            isolated=self.isolated,
            inherit_env=self.inherit_env,
            exit_status=self.exit_status,
            seconds=round(self.seconds, 3),
        )
        return out


# Secrets ------------------------------------------------------------------------------------
def is_secret_name(name: str) -> bool:
    """KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL anywhere in the name, case-insensitive
    (TOKENS and TOKENIZER are not secrets)."""
    return bool(_SECRET_RE.search(name))


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if is_secret_name(str(k)) else v) for k, v in env.items()}


def _redact_text(text: str) -> str:
    """`export WANDB_API_KEY=abc` -> `export WANDB_API_KEY=***`; references (`=$X`, `="${X}"`) stay."""

    def sub(m: re.Match[str]) -> str:
        value = m.group(3).strip()
        if not is_secret_name(m.group(2)) or re.fullmatch(r"""["']?\$\{?[A-Za-z_][^"']*["']?""", value):
            return m.group(0)
        return m.group(1) + "***"

    return _ASSIGN_RE.sub(sub, text)


def _redact_runtime_env(runtime_env: Any) -> Any:
    if isinstance(runtime_env, dict) and isinstance(runtime_env.get("env_vars"), dict):
        return runtime_env | {"env_vars": redact_env(runtime_env["env_vars"])}
    return runtime_env


# The scratch environment --------------------------------------------------------------------
def _prelude() -> str:
    """The BASH_ENV file: capture functions, neutralised commands, the stdin guard, the line tracker."""
    rec = '"${BASH_SOURCE[1]-}" "${BASH_LINENO[0]-}"'
    lines = [
        "# Relax Platform: capture the launch script's commands instead of running them (client/launch_script.py).",
        '[[ ${0%/*} == "$__RELAX_BIN" ]] && return 0',
        # __relax_rec VIA FILE LINE WORD...: one NUL-separated record per call, in a capture file of the
        # calling process's own (`_read_records` merges them by time). A call from a `bash -c` string has
        # no file: it takes the location of the command that started it.
        "__relax_rec() {",
        "  local __relax_f=$2 __relax_l=$3",
        "  [[ -n $__relax_f ]] || __relax_f=${__RELAX_FILE-} __relax_l=${__RELAX_LINE-}",
        '  printf \'%s\\0\' @rec "$1" "$__relax_f" "$__relax_l" "$PWD" "${EPOCHREALTIME-}" "$(($# - 3))" "${@:4}" \\',
        '    >>"$__RELAX_CAPTURE.${EPOCHREALTIME:+${BASHPID-0}}"',
        "}",
    ]
    for name in CAPTURED:
        lines.append(f'{name}() {{ __relax_rec function {rec} {name} "$@"; return 0; }}')
    for name in NEUTRALISED:
        if name == "tee":
            body = f'__relax_rec function {rec} tee "$@"; command cat; return 0;'
        else:
            body = f'__relax_rec function {rec} {name} "$@"; return {_FAILING.get(name, 0)};'
        lines.append(f"{name}() {{ {body} }}")
    # A script that reads standard input would wait for a user: say so (stdin is /dev/null).
    lines += [
        "__relax_stdin() {",
        "  local __relax_a",
        '  for __relax_a in "${@:4}"; do [[ $__relax_a == -*u* && $__relax_a != --* ]] && return 1; done',
        "  [[ /dev/stdin -ef /dev/null ]] || return 1",
        '  __relax_rec stdin "$2" "$3" "$1" "${@:4}"',
        "  printf '%s: line %s: %s reads standard input, which is closed while relaxctl resolves the script'"
        ' "$2" "$3" "$1" >&2',
        "  printf ' (give the value with --env instead)\\n' >&2",
        "  return 0",
        "}",
    ]
    for name in ("read", "mapfile", "readarray"):
        lines.append(
            f'{name}() {{ if __relax_stdin {name} {rec} "$@"; then exit 97; fi; builtin {name} "$@"; }}'
        )
    names = " ".join(
        (*CAPTURED, *NEUTRALISED, "read", "mapfile", "readarray", "__relax_rec", "__relax_stdin")
    )
    lines += [
        f"export -f {names}",
        # Keep the current file and line where stub executables and the time limit can read them.
        "__relax_dbg() {",
        '  [[ -z ${BASH_SOURCE[1]-} || ${BASH_SOURCE[1]} == "$__RELAX_PRELUDE" ]] && return 0',
        # A script that puts its own directories first (`export PATH=/opt/conda/bin:$PATH`) must
        # still reach the stubs through exec, env, timeout, nohup …
        '  [[ $PATH == "$__RELAX_BIN":* ]] || PATH="$__RELAX_BIN:$PATH"',
        '  if [[ ${BASH_LINENO[0]-} != "${__RELAX_LINE-}" || ${BASH_SOURCE[1]-} != "${__RELAX_FILE-}" ]]; then',
        "    __RELAX_FILE=${BASH_SOURCE[1]-} __RELAX_LINE=${BASH_LINENO[0]-}",
        # `1<>` rewrites in place without truncating: a kill at any moment leaves a whole record.
        '    printf \'%s\\0\' "$__RELAX_FILE" "$__RELAX_LINE" "$PWD" 1<>"$__RELAX_WHERE" 2>/dev/null',
        "  fi",
        "  return 0",
        "}",
        'export __RELAX_FILE="${__RELAX_FILE-}" __RELAX_LINE="${__RELAX_LINE-}"',
        "set -T",
        "trap __relax_dbg DEBUG",
        "",
    ]
    return "\n".join(lines)


_STUB = """#!@BASH@
# Relax Platform: a command reached through PATH (exec, env, timeout, nohup, sh -c …) while
# relaxctl resolves a launch script: record it, run nothing.
printf '%s\\0' @rec PATH "${__RELAX_FILE-}" "${__RELAX_LINE-}" "$PWD" "${EPOCHREALTIME-}" "$(($# + 1))" \\
  "${0##*/}" "$@" >>"$__RELAX_CAPTURE.${EPOCHREALTIME:+${BASHPID-$$}}"
case ${0##*/} in
  nvidia-smi) exit 1 ;;
  tee) exec cat ;;
esac
exit 0
"""


@functools.cache
def _isolation() -> tuple[tuple[str, ...], str | None]:
    """(command prefix, note): `unshare --user --map-root-user --net` when this machine allows it."""
    exe = shutil.which("unshare")
    if exe is None:
        return (
            (),
            "no network isolation: `unshare` is not available here (the usual network tools are stubbed)",
        )
    prefix = (exe, "--user", "--map-root-user", "--net", "--")
    try:
        r = subprocess.run([*prefix, "true"], capture_output=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return (), f"no network isolation: unshare failed ({err}); the usual network tools are stubbed"
    if r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {r.returncode}"]
        return (), f"no network isolation: unshare failed ({why[0]}); the usual network tools are stubbed"
    return prefix, None


def _build_env(
    scratch: Path,
    env: Mapping[str, str],
    inherit_env: bool,
    prelude: Path,
    bin_dir: Path,
    capture: Path,
    where: Path,
) -> dict[str, str]:
    base: dict[str, str] = {}
    if inherit_env:
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in _NEVER_INHERITED and not k.startswith(("BASH_FUNC_", "__RELAX_"))
        }
    base.update(
        PATH=os.environ.get("PATH") or _DEFAULT_PATH,
        HOME=str(scratch / "home"),
        TMPDIR=str(scratch / "tmp"),
        LANG=os.environ.get("LANG") or "C.UTF-8",
    )
    base.update(env)
    base["PATH"] = f"{bin_dir}:{base['PATH'] or _DEFAULT_PATH}"
    base.update(
        BASH_ENV=str(prelude),
        __RELAX_PRELUDE=str(prelude),
        __RELAX_BIN=str(bin_dir),
        __RELAX_CAPTURE=str(capture),
        __RELAX_WHERE=str(where),
    )
    return base


# Reading what bash did ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Record:
    via: str
    file: str
    line: int
    cwd: str
    argv: list[str]


def _read_records(capture: Path) -> list[_Record]:
    """Every record the script's processes wrote, in the order they were made.

    Each process appends to a capture file of its own (`capture.PID`): bash's printf writes a record in
    several write(2) calls (its standard output is line-buffered, and a record can be longer than the
    buffer), so records of two processes writing at once (`ray job submit … | tee log`) would interleave in
    one file. Within a file, records are in the order made; across files, by the time bash took
    (`EPOCHREALTIME`). A bash without `EPOCHREALTIME` (before 5.0) has no time to merge by: all its processes
    append to the one file `capture.`, in the order they write, as before."""
    timed: list[tuple[float, int, int, _Record]] = []
    for rank, path in enumerate(sorted(capture.parent.glob(f"{capture.name}.*"))):
        try:
            fields = path.read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        i = 0
        while i + 7 <= len(fields) and fields[i] == b"@rec":
            via, file, line, cwd, when, n = (
                f.decode(errors="surrogateescape") for f in fields[i + 1 : i + 7]
            )
            count = int(n) if n.isdigit() else 0
            if i + 7 + count > len(fields):
                break  # cut short (the process was killed while writing it)
            argv = [f.decode(errors="surrogateescape") for f in fields[i + 7 : i + 7 + count]]
            record = _Record(via, _abspath(file, cwd), int(line) if line.isdigit() else 0, cwd, argv)
            timed.append((_seconds(when), rank, len(timed), record))
            i += 7 + count
    return [record for *_, record in sorted(timed, key=lambda t: t[:3])]


def _seconds(when: str) -> float:
    """`EPOCHREALTIME` as bash wrote it (its decimal point is the locale's); 0 where there is none."""
    try:
        return float(when.replace(",", "."))
    except ValueError:
        return 0.0


def _read_where(path: Path) -> tuple[str | None, int | None]:
    try:
        parts = path.read_bytes().split(b"\0")
    except FileNotFoundError:
        return None, None
    if len(parts) < 3:
        return None, None
    file, line, cwd = (p.decode(errors="surrogateescape") for p in parts[:3])
    return (_abspath(file, cwd) if file else None), (int(line) if line.isdigit() else None)


def _abspath(file: str, cwd: str) -> str:
    if not file:
        return file
    return os.path.normpath(os.path.join(cwd, file)) if cwd else os.path.normpath(file)


def display_path(path: str) -> str:
    """A path for messages: relative to the current directory when it is below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


# Recognising the training command -----------------------------------------------------------
@dataclass(frozen=True)
class _Target:
    kind: str  # module, script, code, stdin, none
    name: str | None
    rest: int  # index of the first word after the module or script


def _python_target(words: list[str], start: int = 1) -> _Target:
    """What a python command line runs, following the interpreter's own option syntax."""
    i = start
    while i < len(words):
        w = words[i]
        if w == "-":
            return _Target("stdin", None, i + 1)
        if w == "--":
            return (
                _Target("script", words[i + 1], i + 2) if i + 1 < len(words) else _Target("none", None, i + 1)
            )
        if w.startswith("--"):
            i += 2 if w == "--check-hash-based-pycs" else 1
            continue
        if not w.startswith("-"):
            return _Target("script", w, i + 1)
        j, nxt = 1, i + 1
        while j < len(w):
            c = w[j]
            if c in "cmWX":
                attached = w[j + 1 :]
                arg = attached or (words[i + 1] if i + 1 < len(words) else "")
                nxt = i + 1 if attached else i + 2
                if c == "c":
                    return _Target("code", arg, nxt)
                if c == "m":
                    return _Target("module", arg, nxt)
                break
            j += 1
        i = nxt
    return _Target("none", None, len(words))


def _leading_options(
    words: list[str], start: int, switches: Collection[str]
) -> tuple[list[tuple[str, str | None]], int]:
    """The options from words[start] up to the first word that is not one (or past a `--`), and the index of
    the word after them: (name, value) pairs in order, value None for one of `switches` (which take none);
    `--a=b` and `--a b` both give ("--a", "b"), and an option that ends the line without its value "".
    """
    options: list[tuple[str, str | None]] = []
    i = start
    while i < len(words):
        w = words[i]
        if w == "--":
            i += 1
            break
        if not w.startswith("-"):
            break
        name, eq, value = w.partition("=")
        if w in switches:
            options.append((w, None))
            i += 1
        elif eq:
            options.append((name, value))
            i += 1
        else:
            options.append((w, words[i + 1] if i + 1 < len(words) else ""))
            i += 2
    return options, i


def _torchrun_target(words: list[str], start: int) -> _Target:
    """The script (or module, with -m) that torchrun / python -m torch.distributed.run starts."""
    options, i = _leading_options(words, start, _TORCHRUN_SWITCHES)
    module = any(name in ("-m", "--module") and value is None for name, value in options)
    if i >= len(words):
        return _Target("none", None, len(words))
    return _Target("module" if module else "script", words[i], i + 1)


def _is_training(target: _Target) -> bool:
    if target.name is None:
        return False
    if target.kind == "module":
        prefix = "relax.entrypoints."
        return target.name.startswith(prefix) and "train" in target.name[len(prefix) :]
    if target.kind == "script":
        norm = os.path.normpath(target.name).replace(os.sep, "/")
        base = norm.rsplit("/", 1)[-1]
        under_entrypoints = norm.startswith("relax/entrypoints/") or "/relax/entrypoints/" in norm
        return base in TRAIN_SCRIPTS or (under_entrypoints and "train" in base)
    return False


def _is_python(word: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(word)) is not None


@dataclass(frozen=True)
class _Command:
    """A command line classified: its target, and for training commands where the flags start."""

    launcher: str  # python, torchrun
    target: _Target
    words: list[str]

    @property
    def training(self) -> bool:
        return _is_training(self.target)

    def entrypoint(self) -> str:
        return shlex.join(self.words[: self.target.rest])

    def describe(self) -> str:
        t = self.target
        if t.kind == "stdin":
            return f"{self.words[0]} - (a script on standard input)"
        if t.kind == "code":
            return f"{self.words[0]} -c …"
        if t.kind == "none":
            return shlex.join(self.words[:3])
        return self.entrypoint()


def _classify(words: list[str]) -> _Command | None:
    """python … / torchrun … / python -m torch.distributed.run …; None for anything else."""
    words = list(words)
    while words and words[0] == "env":  # `env A=1 python3 …` inside a ray entrypoint
        words = words[1:]
        while words and (("=" in words[0] and not words[0].startswith("-")) or words[0] in ("-i", "-u")):
            words = words[2:] if words[0] == "-u" else words[1:]
    if not words:
        return None
    head = os.path.basename(words[0])
    if head == "torchrun":
        return _Command("torchrun", _torchrun_target(words, 1), words)
    if _is_python(head):
        t = _python_target(words)
        if t.kind == "module" and t.name in _TORCH_LAUNCHER_MODULES:
            return _Command("torchrun", _torchrun_target(words, t.rest), words)
        return _Command("python", t, words)
    return None


@dataclass(frozen=True)
class _RaySubmit:
    options: dict[str, str]
    entrypoint: list[str]


def _ray_submit(words: list[str]) -> _RaySubmit | None:
    if words[1:3] != ["job", "submit"]:
        return None
    given, i = _leading_options(words, 3, ("--no-wait",))
    options = {name: "" if value is None else value for name, value in given}
    entry = words[i:]
    if len(entry) == 1 and " " in entry[0].strip():  # `-- "python3 train.py …"` as one word
        try:
            entry = shlex.split(entry[0])
        except ValueError:
            pass
    return _RaySubmit(options, entry)


# Resolution ---------------------------------------------------------------------------------
def _short(words: list[str], limit: int = 80) -> str:
    text = shlex.join(words)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _stderr_tail(text: str, scratch: str, n: int = _STDERR_TAIL) -> list[str]:
    """The script's last stderr lines, without the xtrace noise of the capture machinery."""
    keep = [
        ln
        for ln in text.splitlines()
        if ln.strip() and not _XTRACE_RE.match(ln) and scratch not in ln and not _MACHINERY_RE.search(ln)
    ]
    return keep[-n:]


def _syntax_error(stderr: str) -> tuple[str, int, str] | None:
    for ln in stderr.splitlines():
        m = _BASH_ERROR_RE.match(ln)
        if m and any(
            s in m.group("msg") for s in ("syntax error", "unexpected EOF", "unexpected end of file")
        ):
            return m.group("file"), int(m.group("line")), m.group("msg")
    return None


def resolve_launch_script(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    script_args: Sequence[str] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    inherit_env: bool = False,
) -> ResolvedScript:
    """Run the launch script with bash in a scratch environment and return its training command.

    Raises LaunchScriptError (nothing should be submitted) when the script is missing, has a
    syntax error, reads standard input, runs past `timeout_s`, exits with an error before its
    training command, reaches no training command, or reaches more than one.
    """
    t0 = time.monotonic()
    given = str(path)
    env = dict(env or {})
    script_args = [str(a) for a in script_args]
    for key in env:
        if not _ENV_NAME_RE.match(key):
            raise LaunchScriptError("bad_env", given, f"--env {key!r}: not a shell variable name")
    script = Path(given).expanduser()
    if not script.exists():
        raise LaunchScriptError("not_found", given, "no such launch script")
    script = script.resolve()
    if not script.is_file():
        raise LaunchScriptError("not_found", given, "not a file")
    try:
        raw = script.read_bytes()
    except OSError as err:
        raise LaunchScriptError("unreadable", given, f"cannot read it ({err.strerror})") from None
    bash = shutil.which("bash")
    if bash is None:
        raise LaunchScriptError(
            "no_bash", given, "bash is not installed here; relaxctl runs launch scripts with bash"
        )

    full_text = raw.decode("utf-8", errors="replace")
    text = _redact_text(full_text)
    capped = text.encode()[:TEXT_CAP].decode("utf-8", errors="ignore")
    prefix, isolation_note = _isolation()
    notes = [isolation_note] if isolation_note else []

    scratch = Path(tempfile.mkdtemp(prefix="relax-script-"))
    try:
        for sub in ("home", "tmp", "bin"):
            (scratch / sub).mkdir()
        bin_dir, prelude = scratch / "bin", scratch / "prelude.sh"
        capture, where, errfile = scratch / "capture", scratch / "where", scratch / "stderr"
        prelude.write_text(_prelude())
        stub = scratch / "stub"
        stub.write_text(_STUB.replace("@BASH@", bash))
        stub.chmod(0o755)
        for name in (*CAPTURED, *NEUTRALISED):
            (bin_dir / name).symlink_to(stub)
        run_env = _build_env(scratch, env, inherit_env, prelude, bin_dir, capture, where)

        # A syntax error in the script itself: say so before running any of it.
        check = subprocess.run(
            [bash, "-n", str(script)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env={"PATH": run_env["PATH"], "LANG": run_env["LANG"]},
            timeout=max(timeout_s, 1.0),
        )
        if check.returncode != 0:
            hit = _syntax_error(check.stderr)
            file, line, msg = hit if hit else (str(script), None, check.stderr.strip()[-500:])
            raise LaunchScriptError(
                "syntax", given, f"bash cannot parse it: {msg}", file=display_path(file), line=line
            )

        timed_out = False
        with open(errfile, "wb") as err_out:
            proc = subprocess.Popen(
                [*prefix, bash, str(script), *script_args],
                cwd=script.parent,
                env=run_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err_out,
                start_new_session=True,
            )
            try:
                status = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                status = proc.wait()
            _kill_group(proc.pid)  # whatever it left in the background
        stderr = errfile.read_text(errors="replace")
        records = _read_records(capture)
        where_file, where_line = _read_where(where)
        return _result(
            given=given,
            script=script,
            raw=raw,
            text=capped,
            truncated=len(text.encode()) > TEXT_CAP,
            env=env,
            script_args=script_args,
            records=records,
            status=status,
            timed_out=timed_out,
            timeout_s=timeout_s,
            where=(where_file, where_line),
            stderr=stderr,
            scratch=str(scratch),
            notes=notes,
            isolated=bool(prefix),
            inherit_env=inherit_env,
            t0=t0,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(
    *,
    given: str,
    script: Path,
    raw: bytes,
    text: str,
    truncated: bool,
    env: dict[str, str],
    script_args: list[str],
    records: list[_Record],
    status: int,
    timed_out: bool,
    timeout_s: float,
    where: tuple[str | None, int | None],
    stderr: str,
    scratch: str,
    notes: list[str],
    isolated: bool,
    inherit_env: bool,
    t0: float,
) -> ResolvedScript:
    tail = _stderr_tail(stderr, scratch)
    for r in records:
        if r.via == "stdin":
            raise LaunchScriptError(
                "reads_stdin",
                given,
                f"the script reads standard input ({r.argv[0] if r.argv else 'read'}), which relaxctl closes; "
                "give the value with --env NAME=VALUE instead",
                file=display_path(r.file),
                line=r.line,
            )
    hit = _syntax_error(stderr)
    if hit:
        file, line, msg = hit
        raise LaunchScriptError(
            "syntax", given, f"bash cannot parse it: {msg}", file=display_path(file), line=line
        )

    calls: list[Call] = []
    neutralised: list[Call] = []
    training: list[tuple[int, Call, _Command, _RaySubmit | None]] = []
    for r in records:
        if not r.argv:
            continue
        name = os.path.basename(r.argv[0])
        if name not in CAPTURED:
            neutralised.append(Call(r.argv, r.file, r.line, r.via, "neutralised", _short(r.argv)))
            continue
        submit = _ray_submit(r.argv) if name == "ray" else None
        cmd = _classify(submit.entrypoint if submit else r.argv)
        if name == "ray":
            kind = "ray"
            if submit is None:
                what = shlex.join(r.argv[:3])
            else:
                what = "ray job submit -- " + (cmd.describe() if cmd else shlex.join(submit.entrypoint[:3]))
        else:
            kind = "torchrun" if cmd and cmd.launcher == "torchrun" else "python"
            what = cmd.describe() if cmd else shlex.join(r.argv[:2])
        call = Call(r.argv, r.file, r.line, r.via, kind, what)
        calls.append(call)
        if cmd is not None and cmd.training:
            training.append((len(calls) - 1, call, cmd, submit))

    where_file, where_line = where
    status_text = f"exit status {status}" if status >= 0 else f"killed by signal {-status}"
    if len(training) > 1:
        raise LaunchScriptError(
            "several_training_commands",
            given,
            f"the script runs {len(training)} training commands; relaxctl submits one job per script "
            "(split the script, or choose with an --env variable)",
            details=[f"{c.where()}: {c.what}" for _, c, _, _ in training],
        )
    if not training:
        if timed_out:
            raise LaunchScriptError(
                "timeout",
                given,
                f"still running after {timeout_s:g} s (the time limit; --script-timeout) before reaching a "
                "training command",
                file=display_path(where_file) if where_file else None,
                line=where_line,
                details=[f"stderr: {ln}" for ln in tail[-5:]],
            )
        seen = [f"not a training command: {c.what} ({c.where()})" for c in calls]
        if any(_REDIRECT_FAILED_RE.match(ln) for ln in tail):
            seen.append(
                "hint: bash could not open a redirection target, so it skipped that command; mkdir does "
                "nothing while relaxctl resolves a script (point the variable at an existing directory with --env, or use | tee)"
            )
        if status != 0:
            raise LaunchScriptError(
                "exited",
                given,
                f"the script stopped with {status_text} before reaching a training command",
                file=display_path(where_file) if where_file else None,
                line=where_line,
                details=[*seen, *(f"stderr: {ln}" for ln in tail)],
            )
        raise LaunchScriptError(
            "no_training_command",
            given,
            f"the script ended ({status_text}) without running a training command "
            "(python3 -m relax.entrypoints.train…, train.py or train_async.py, directly, through torchrun or "
            "as the entrypoint of `ray job submit -- …`)",
            details=[*seen, *(f"stderr: {ln}" for ln in tail)],
        )

    index, call, cmd, submit = training[0]
    argv = cmd.words[cmd.target.rest :]
    if timed_out:
        notes.append(
            f"the script was still running {timeout_s:g} s after its training command, at "
            f"{display_path(where_file or '?')}:{where_line}; it was stopped there and what follows was not checked"
        )
    elif status != 0:
        notes.append(f"the script ended with {status_text} after its training command (ignored)")
    leaked = [w for w in argv if scratch in w]
    if leaked:
        raise LaunchScriptError(
            "scratch_path",
            given,
            "the training command refers to the scratch HOME or TMPDIR that relaxctl gives the script "
            f"({leaked[0]!r}); give the real value with --env HOME=… (or the variable the script reads)",
            file=display_path(call.file),
            line=call.line,
        )
    runtime_env = runtime_env_path = working_dir = submission_id = None
    launcher = cmd.launcher
    if submit is not None:
        launcher = "ray job submit"
        opts = submit.options
        if "--runtime-env-json" in opts:
            # Provenance only: the platform builds the job's environment itself, so a runtime env that
            # Ray would refuse is noted, not fatal (scripts often pass an empty $RUNTIME_ENV_JSON that
            # only their own entrypoint script fills in).
            try:
                runtime_env = json.loads(opts["--runtime-env-json"])
            except json.JSONDecodeError as err:
                runtime_env = None
                notes.append(
                    f"--runtime-env-json of `ray job submit` is not valid JSON ({err.msg} at column "
                    f"{err.colno}): {_redact_text(opts['--runtime-env-json'][:200])!r}; not kept"
                )
            if runtime_env is not None and not isinstance(runtime_env, dict):
                notes.append("--runtime-env-json of `ray job submit` is not a JSON object; not kept")
                runtime_env = None
            if runtime_env is not None:
                runtime_env = _redact_runtime_env(runtime_env)
        runtime_env_path = opts.get("--runtime-env")
        if runtime_env_path:
            notes.append(f"ray job submit --runtime-env {runtime_env_path}: the file is noted, not read")
        working_dir = opts.get("--working-dir")
        submission_id = opts.get("--submission-id") or opts.get("--job-id")

    return ResolvedScript(
        path=str(script),
        text=text,
        text_truncated=truncated,
        sha256=hashlib.sha256(raw).hexdigest(),
        env=redact_env(env),
        script_args=script_args,
        argv=argv,
        command=call.argv,
        entrypoint=cmd.entrypoint(),
        launcher=launcher,
        file=call.file,
        line=call.line,
        runtime_env=runtime_env,
        runtime_env_path=runtime_env_path,
        working_dir=working_dir,
        submission_id=submission_id,
        calls=calls,
        training_index=index,
        neutralised=neutralised,
        notes=notes,
        isolated=isolated,
        inherit_env=inherit_env,
        exit_status=status,
        seconds=time.monotonic() - t0,
    )
