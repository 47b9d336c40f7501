"""Extract the Relax flags from a bash launch script, as far as that can be done without running it.

Understood: ``\\`` line continuations; comments; single and double quotes; scalar assignments
(``NAME=value``, ``export NAME=value``, ``NAME+=value``); arrays (``NAME=( ... )``, ``NAME+=( ... )``)
expanded with ``"${NAME[@]}"``; ``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``,
``${NAME:+word}``; ``"$@"`` (the script's own arguments, given as `args`). The command is the one
that runs ``train.py`` / ``train_async.py`` or ``-m relax.entrypoints.train`` (directly, or after
``ray job submit ... --``); its flags end at the first pipe, redirection or command separator.

Not evaluated, and reported instead: variables the script never assigns (unless given in `env`),
command substitutions ``$(...)``, and assignments inside ``if``/``case``/``for`` blocks (not applied;
a warning names the variable when the command uses it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jobspec.issues import SpecError, SpecIssue

__all__ = ["LaunchScript", "scan_launch_script", "parse_launch_script"]

_ASSIGN = re.compile(
    r"^(?:(?:export|local|readonly|declare|typeset)(?:\s+-\w+)*\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)="
)
_ENTRY_FILE = re.compile(r"(^|/)(train|train_async)\.py$")
_ENTRY_MODULES = {"relax.entrypoints.train", "relax.entrypoints.train_async"}
_OPEN_BLOCK = {"if", "for", "while", "until", "case", "select"}
_CLOSE_BLOCK = {"fi", "done", "esac"}
_PREFIX_KEYWORDS = {"then", "else", "do", "elif"}
_FUNC_DEF = re.compile(r"^[A-Za-z_][\w-]*\s*\(\s*\)\s*\{?")


@dataclass
class LaunchScript:
    """What could be read from a launch script: the flags, and what could not be resolved."""

    argv: list[str] = field(default_factory=list)
    issues: list[SpecIssue] = field(default_factory=list)
    entrypoint: str | None = None


# ---------------------------------------------------------------------------------------------
# Tokenizing: a word is a list of parts; parts keep track of quoting for word splitting.


@dataclass
class _Part:
    kind: str  # "lit" | "var" | "cmd"
    text: str = ""
    quoted: bool = False
    name: str = ""
    index: str = ""  # "", "@", "*" or a number
    op: str = ""  # "", ":-", "-", ":+", "+", ":=", "="
    arg: str = ""


@dataclass
class _Word:
    parts: list[_Part] = field(default_factory=list)
    op: str | None = None  # shell operator token (|, &&, ;, >, ...)

    @property
    def raw(self) -> str:
        out = []
        for p in self.parts:
            if p.kind == "lit":
                out.append(p.text)
            elif p.kind == "cmd":
                out.append(f"$({p.text})")
            else:
                out.append("${" + p.name + (f"[{p.index}]" if p.index else "") + p.op + p.arg + "}")
        return "".join(out)


def _closing_brace(s: str, start: int) -> int:
    """Index of the '}' closing a '${' whose body starts at `start` (nested braces and quotes skipped)."""
    depth, quote, j = 1, "", start
    while j < len(s):
        c = s[j]
        if quote:
            if c == "\\" and quote == '"':
                j += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return -1


def _parse_dollar(s: str, i: int, quoted: bool) -> tuple[_Part, int]:
    """Parse an expansion starting at s[i] == '$'. Returns (part, next index)."""
    nxt = s[i + 1] if i + 1 < len(s) else ""
    if nxt == "(":
        depth, j = 1, i + 2
        while j < len(s) and depth:
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            j += 1
        return _Part("cmd", text=s[i + 2 : j - 1], quoted=quoted), j
    if nxt == "{":
        j = _closing_brace(s, i + 2)
        if j < 0:
            return _Part("lit", text=s[i:], quoted=quoted), len(s)
        body = s[i + 2 : j]
        m = re.match(
            r"^(#?)([A-Za-z_][A-Za-z0-9_]*|[@*#?$!0-9])(?:\[([^\]]*)\])?(?:(:?[-+=?])(.*))?$", body, re.S
        )
        if not m or m.group(1):
            return _Part("var", name=body, quoted=quoted, op="?unsupported"), j + 1
        return _Part(
            "var",
            name=m.group(2),
            index=m.group(3) or "",
            op=m.group(4) or "",
            arg=m.group(5) or "",
            quoted=quoted,
        ), j + 1
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[@*#?$!0-9]", s[i + 1 :])
    if m:
        return _Part("var", name=m.group(0), quoted=quoted), i + 1 + len(m.group(0))
    return _Part("lit", text="$", quoted=quoted), i + 1


def _tokenize(s: str) -> list[_Word]:
    """Split one statement into words (and operator tokens)."""
    words: list[_Word] = []
    cur: _Word | None = None
    buf: list[str] = []

    def flush_lit(quoted: bool = False) -> None:
        nonlocal cur
        if buf:
            cur = cur or _Word()
            cur.parts.append(_Part("lit", text="".join(buf), quoted=quoted))
            buf.clear()

    def end_word() -> None:
        nonlocal cur
        flush_lit()
        if cur is not None:
            words.append(cur)
        cur = None

    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in " \t\n\r":
            end_word()
            i += 1
        elif c == "#" and cur is None and not buf:
            j = s.find("\n", i)
            i = n if j < 0 else j
        elif c == "\\" and i + 1 < n:
            buf.append(s[i + 1])
            i += 2
        elif c == "'":
            j = s.find("'", i + 1)
            j = n if j < 0 else j
            flush_lit()
            cur = cur or _Word()
            cur.parts.append(_Part("lit", text=s[i + 1 : j], quoted=True))
            i = j + 1
        elif c == '"':
            flush_lit()
            cur = cur or _Word()
            cur.parts.append(_Part("lit", text="", quoted=True))  # keeps "" as an (empty) word
            i += 1
            while i < n and s[i] != '"':
                if s[i] == "\\" and i + 1 < n and s[i + 1] in '"\\$`':
                    buf.append(s[i + 1])
                    i += 2
                elif s[i] == "$":
                    flush_lit(quoted=True)
                    part, i = _parse_dollar(s, i, quoted=True)
                    cur.parts.append(part)
                else:
                    buf.append(s[i])
                    i += 1
            flush_lit(quoted=True)
            i += 1
        elif c == "$":
            flush_lit()
            cur = cur or _Word()
            part, i = _parse_dollar(s, i, quoted=False)
            cur.parts.append(part)
        elif c == "`":
            j = s.find("`", i + 1)
            j = n if j < 0 else j
            flush_lit()
            cur = cur or _Word()
            cur.parts.append(_Part("cmd", text=s[i + 1 : j]))
            i = j + 1
        elif c in "|&;<>":
            prefix = ""
            if c in "<>" and buf and "".join(buf).isdigit() and (cur is None or not cur.parts):
                prefix = "".join(buf)
                buf.clear()
            end_word()
            j = i
            while j < n and s[j] in "|&;<>":
                j += 1
            words.append(_Word(op=prefix + s[i:j]))
            i = j
        else:
            buf.append(c)
            i += 1
    end_word()
    return words


# ---------------------------------------------------------------------------------------------
# Statements


def _statements(text: str) -> list[tuple[int, str]]:
    """Logical statements (with their 1-based line), honouring quotes, parentheses and continuations."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    quote = ""
    depth = 0
    line = start_line = 1
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\n":
            line += 1
        if quote:
            if c == "\\" and quote == '"' and i + 1 < len(text):
                buf.append(c + text[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
            buf.append(c)
        elif c in "'\"":
            quote = c
            buf.append(c)
        elif c == "#" and (not buf or buf[-1] in " \t\n;("):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif c == "(":
            depth += 1
            buf.append(c)
        elif c == ")":
            depth = max(0, depth - 1)
            buf.append(c)
        elif (c == "\n" or c == ";") and depth == 0:
            stmt = "".join(buf).strip()
            if stmt:
                out.append((start_line, stmt))
            buf = []
            start_line = line
        else:
            buf.append(c)
        i += 1
    stmt = "".join(buf).strip()
    if stmt:
        out.append((start_line, stmt))
    return out


class _Scanner:
    def __init__(self, env: dict[str, Any] | None, args: list[str]):
        self.vars: dict[str, str | list[str]] = {
            k: (list(v) if isinstance(v, (list, tuple)) else str(v)) for k, v in (env or {}).items()
        }
        self.args = list(args)
        self.conditional: dict[str, int] = {}
        # variables whose assigned value contains something unresolved, with the reasons
        self.tainted: dict[str, list[tuple[str, str]]] = {}
        self.item_taint: dict[str, list[list[tuple[str, str]]]] = {}
        # reasons attached to expansions that produced no word at all (e.g. an empty array)
        self.orphans: list[tuple[str, str]] = []
        self.sourced: list[str] = []
        self.unresolved: list[tuple[str, str]] = []  # (what, kind) seen while expanding the current word

    # -- expansion ----------------------------------------------------------------------------
    def _lookup(self, p: _Part) -> tuple[str | list[str] | None, bool]:
        if p.op == "?unsupported":
            return None, False
        if p.name in ("@", "*"):
            return list(self.args), True
        value = self.vars.get(p.name)
        if isinstance(value, list) and p.index not in ("@", "*"):
            value = (
                value[int(p.index)]
                if p.index.isdigit() and int(p.index) < len(value)
                else (value[0] if value and not p.index else None)
            )
        empty = value is None or value == "" or value == []
        if p.op in (":-", ":="):
            return (self._expand_text(p.arg) if empty else value), True
        if p.op in ("-", "="):
            return (self._expand_text(p.arg) if value is None else value), True
        if p.op == ":+":
            return ("" if empty else self._expand_text(p.arg)), True
        if p.op == "+":
            return ("" if value is None else self._expand_text(p.arg)), True
        return value, value is not None

    def _expand_text(self, text: str) -> str:
        words = self.expand(_tokenize_quoted(text))
        return " ".join(words)

    def expand(self, word: _Word) -> list[str]:
        """Expand one word into fields; what could not be resolved is added to `self.unresolved`."""
        pairs = self.expand_fields(word)
        for _, reasons in pairs:
            self.unresolved.extend(reasons)
        return [text for text, _ in pairs]

    def expand_fields(self, word: _Word) -> list[tuple[str, list[tuple[str, str]]]]:
        """Expand one word into (field, unresolved reasons of that field) pairs."""
        fields: list[tuple[str, list[tuple[str, str]]]] = []
        cur: list[str] | None = None
        why: list[tuple[str, str]] = []
        only_empty_literals = all(p.kind == "lit" and not p.text for p in word.parts)

        def add(text: str, reasons: list[tuple[str, str]] = ()) -> None:  # type: ignore[assignment]
            nonlocal cur
            if cur is None:
                cur = []
            cur.append(text)
            why.extend(reasons)

        def new_field() -> None:
            nonlocal cur, why
            if cur is not None:
                fields.append(("".join(cur), list(dict.fromkeys(why))))
            cur, why = None, []

        for p in word.parts:
            if p.kind == "lit":
                # the empty literal that marks a quoted word only makes a field of its own for a bare ""
                if p.text or only_empty_literals:
                    add(p.text)
                continue
            if p.kind == "cmd":
                add(f"$({p.text})", [(f"$({p.text})", "command")])
                continue
            value, ok = self._lookup(p)
            if not ok:
                add(_Word(parts=[p]).raw, [(p.name, "variable")])
                continue
            shared = [(p.name, "conditional")] if p.name in self.conditional else []
            if isinstance(value, list):
                per_item = self.item_taint.get(p.name, [])
                if p.quoted and p.index == "*":
                    add(" ".join(value), shared + [r for rs in per_item for r in rs])
                    continue
                items: list[tuple[str, list[tuple[str, str]]]] = []
                for k, item in enumerate(value):
                    reasons = shared + (per_item[k] if k < len(per_item) else [])
                    pieces = [item] if p.quoted else item.split()
                    items += [(piece, reasons) for piece in pieces]
                if not items:
                    self.orphans.extend(shared)
                for k, (item, reasons) in enumerate(items):
                    if k:
                        new_field()
                    add(item, reasons)
                continue
            reasons = shared + self.tainted.get(p.name, [])
            if p.quoted:
                add(value, reasons)
            else:
                if not value.split():
                    self.orphans.extend(reasons)
                for k, piece in enumerate(value.split()):
                    if k:
                        new_field()
                    add(piece, reasons)
        new_field()
        return fields


def _tokenize_quoted(text: str) -> _Word:
    words = _tokenize(text)
    merged = _Word()
    for k, w in enumerate(words):
        if k:
            merged.parts.append(_Part("lit", text=" ", quoted=True))
        merged.parts.extend(w.parts)
    return merged


def _entry_index(words: list[str]) -> int | None:
    for k, w in enumerate(words):
        if _ENTRY_FILE.search(w):
            return k
        if w in _ENTRY_MODULES and k > 0 and words[k - 1] == "-m":
            return k
    return None


def scan_launch_script(text: str, env: dict[str, Any] | None = None, args: list[str] = ()) -> LaunchScript:  # type: ignore[assignment]
    """Read the Relax flags of a launch script; never raises. `env`: values for variables the script
    takes from its environment; `args`: the script's own arguments (what ``"$@"`` expands to)."""
    sc = _Scanner(env, list(args))
    result = LaunchScript()
    depth = 0
    found: list[tuple[int, list[str], list[list[tuple[str, str]]], str, list[tuple[str, str]]]] = []
    for line, stmt in _statements(text):
        words = _tokenize(stmt)
        if not words:
            continue
        first = words[0].raw if words[0].op is None else ""
        if first in _PREFIX_KEYWORDS:
            words = words[1:]
            if not words:
                continue
            first = words[0].raw if words[0].op is None else ""
        if first in _CLOSE_BLOCK or first == "}":
            depth = max(0, depth - 1)
            continue
        if first in _OPEN_BLOCK or first == "function" or _FUNC_DEF.match(stmt):
            depth += 1
            continue
        if first in ("source", ".") and len(words) > 1:
            sc.sourced.append(words[1].raw)
            continue
        m = _ASSIGN.match(stmt)
        if m and not _entry_in(stmt):
            name, append = m.group(1), m.group(2) == "+"
            rest = stmt[m.end() :]
            if depth > 0:
                sc.conditional.setdefault(name, line)
                continue
            if rest.startswith("("):
                inner = rest[1 : rest.rfind(")")] if ")" in rest else rest[1:]
                items: list[str] = []
                item_reasons: list[list[tuple[str, str]]] = []
                for w in _tokenize(inner):
                    if w.op is None:
                        for text, reasons in sc.expand_fields(w):
                            items.append(text)
                            item_reasons.append(reasons)
                if append:
                    old_items = sc.vars.get(name)
                    known = sc.item_taint.get(name, [])
                    count = len(old_items) if isinstance(old_items, list) else (1 if old_items else 0)
                    item_reasons = known + [[]] * (count - len(known)) + item_reasons
                sc.item_taint[name] = item_reasons
                old = sc.vars.get(name) if append else None
                base = old if isinstance(old, list) else ([old] if isinstance(old, str) and old else [])
                sc.vars[name] = base + items
            else:
                value_words = _tokenize(rest)
                sc.unresolved = []
                value = (
                    "".join(sc.expand(value_words[0])) if value_words and value_words[0].op is None else ""
                )
                _taint(sc, name, append)
                old = sc.vars.get(name, "") if append else ""
                sc.vars[name] = (old if isinstance(old, str) else " ".join(old)) + value
            continue
        # a command: expand word by word, keeping track of what could not be resolved
        expanded: list[str] = []
        trouble: list[list[tuple[str, str]]] = []
        sc.orphans = []
        for w in words:
            if w.op is not None:
                expanded.append("\x00" + w.op)
                trouble.append([])
                continue
            pairs = sc.expand_fields(w)
            expanded += [text for text, _ in pairs]
            trouble += [reasons for _, reasons in pairs]
        k = _entry_index(expanded)
        if k is not None:
            found.append((line, expanded[k + 1 :], trouble[k + 1 :], expanded[k], list(sc.orphans)))

    if not found:
        result.issues.append(
            SpecIssue(
                "script.no_entrypoint",
                None,
                "no command in the script runs Relax's train.py / relax.entrypoints.train",
                "pass the flags directly with normalize(argv=...)",
            )
        )
        return result
    if len(found) > 1:
        result.issues.append(
            SpecIssue(
                "script.several_entrypoints",
                None,
                f"{len(found)} commands run the training entrypoint (lines {', '.join(str(f[0]) for f in found)}); "
                "the last one is read",
                "keep one training command per script",
                severity="warning",
            )
        )
    line, tokens, trouble, entry, orphans = found[-1]
    result.entrypoint = entry
    owner: str | None = None  # the flag whose value(s) the current token is
    reported: set[tuple[str, str, str | None]] = set()
    for tok, problems in zip(tokens, trouble, strict=True):
        if tok.startswith("\x00"):
            break  # pipe, redirection or separator: the flags end here
        if tok.startswith("--") and len(tok) > 2:
            body = tok[2:]
            owner = None if "=" in body else _value_flag(body)
            if "=" in body:
                problem_owner: str | None = body.split("=", 1)[0]
            else:
                problem_owner = None
        else:
            problem_owner = owner
        result.argv.append(tok)
        for what, kind in problems:
            key = (what, kind, problem_owner if kind != "conditional" else None)
            if key in reported:
                continue
            reported.add(key)
            result.issues.append(_trouble_issue(what, kind, tok, problem_owner, line, sc))
    for what, kind in dict.fromkeys(orphans):
        if (what, kind, None) not in reported:
            reported.add((what, kind, None))
            result.issues.append(_trouble_issue(what, kind, f"${what}", None, line, sc))
    return result


def _value_flag(flag: str) -> str | None:
    """`flag` when it takes a value (so the next word is its value), else None."""
    from jobspec.spec import field_for_flag

    spec = field_for_flag(flag)
    if spec is not None and spec.kind in ("flag", "negatable"):
        return None
    if spec is None and flag.startswith("no-"):
        return None
    return flag


def _taint(sc: _Scanner, name: str, append: bool) -> None:
    """Remember what could not be resolved in a variable's value, to report it where the value is used."""
    reasons = list(dict.fromkeys(sc.unresolved))
    sc.unresolved = []
    if append:
        sc.tainted[name] = list(dict.fromkeys(sc.tainted.get(name, []) + reasons))
    elif reasons:
        sc.tainted[name] = reasons
    else:
        sc.tainted.pop(name, None)


def _entry_in(stmt: str) -> bool:
    return bool(re.search(r"(^|[\s/])(train|train_async)\.py\b|relax\.entrypoints\.train", stmt))


def _trouble_issue(what: str, kind: str, token: str, owner: str | None, line: int, sc: _Scanner) -> SpecIssue:
    where = f"the value of --{owner}" if owner else f"the word {token!r} (flags or values unknown)"
    if kind == "command":
        return SpecIssue(
            "script.command_substitution",
            owner,
            f"{where} comes from a command substitution {what}, which is not run (line {line})",
            "replace it with its value",
        )
    if kind == "conditional":
        return SpecIssue(
            "script.conditional_assignment",
            owner,
            f"the command uses ${what}, which is also changed inside an if/case/for block (line "
            f"{sc.conditional[what]}); that change was not applied",
            f"check {what} by hand, or give its final value in env",
            severity="warning",
        )
    sourced = f" (perhaps in {', '.join(sc.sourced)}, which is not read)" if sc.sourced else ""
    return SpecIssue(
        "script.unresolved_variable",
        owner,
        f"{where} uses ${what}, which the script does not define{sourced} (line {line})",
        f"give {what} in env=..., or write the value into the script",
    )


def parse_launch_script(text: str, env: dict[str, Any] | None = None, args: list[str] = ()) -> list[str]:  # type: ignore[assignment]
    """The Relax flags of a launch script. Raises `SpecError` listing every flag that could not be
    resolved (unknown variables, command substitutions) or when no training command is found."""
    scanned = scan_launch_script(text, env=env, args=args)
    if any(i.is_error for i in scanned.issues):
        raise SpecError(scanned.issues)
    return scanned.argv
