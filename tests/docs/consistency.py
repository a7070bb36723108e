#!/usr/bin/env python3
"""The `docs` tier's consistency check: what the pages tell a reader to type agrees with the code.

    consistency.py TRAINER SOURCE_DIR

1. Interpreters. Every command in the docs (README.md, CONTRIBUTING.md, docs/**/*.md: fenced
   blocks, hidden docs-test blocks and `inline` spans; the comments of configs/*.yaml) that runs
   a script of scripts/ runs it with a Python that has what the script imports:
   - `"$TRAINER_VENV/bin/python" scripts/X.py` (or $TRAINER_PYTHON): always right;
   - `scripts/X.py` (its shebang is /usr/bin/env python3) or `python3 scripts/X.py`: right only
     when X imports nothing outside the standard library and the scripts beside it, or runs
     itself again under the project's Python when an import fails
     (`project_python.reexec`, scripts/project_python.py);
   - in a fenced block, `scripts/X.py` or `scripts/X.sh` run directly must be executable.
   `python3 -c '...'` and `python3 - <<EOF` bodies must import only the standard library too.
2. --dev. A guide (README.md, docs/guides/*.md) whose commands need the tools that
   `scripts/bootstrap.sh --dev` installs (a script of 1 that leaves the standard library, or the
   virtualenv's programs: "$TRAINER_VENV/bin/...") says so: it names `bootstrap.sh --dev`.
3. Keys. Every `section.key` that a guide (README.md, docs/guides/*.md, docs/language-models.md,
   docs/reference.md) or a config's comments name is a key of `TRAINER --help-config`
   (tests/docs/reference_keys.sh checks the other way: every key is in docs/reference.md).
   `section.prefix_*` must be the start of a key.

Exits 1 naming each FILE:LINE and what to change; 0 with a PASS line."""
import ast
import os
import re
import stat
import subprocess
import sys

# Dotted names that start like a key but are files: `model.safetensors`, `slurm/train.sbatch`.
FILE_EXTENSIONS = {"safetensors", "json", "jsonl", "yaml", "yml", "bin", "py", "sh", "sbatch",
                   "md", "png", "txt", "log", "csv", "dat", "gguf", "pt", "gz", "tar", "mask",
                   "docs", "tiktoken", "parquet", "zst"}
VENV_PYTHON = re.compile(r'^"?\$\{?TRAINER_(VENV\}?/bin/python3?|PYTHON\}?)"?$')
# The system's Python, whatever it has installed (another path to a python is a virtualenv the
# reader made: taken as right).
ANY_PYTHON = re.compile(r"^(/usr(/local)?/bin/)?python(3(\.\d+)?)?$")
SCRIPT = re.compile(r"(?<![\w/.$-])scripts/([\w-]+\.(?:py|sh))")
INLINE_PYTHON = re.compile(
    r"""(?P<interp>"?\$\{?TRAINER_\w+\}?[\w/]*"?|\S*python3?(?:\.\d+)?)\s+"""
    r"""(?:-c\s+(?:'(?P<code>[^']*)'|"(?P<dcode>[^"]*)")|-\s+<<-?\s*'?(?P<tag>\w+)'?)""")


class Text:
    """The commands of one file: (line, text, fenced) pieces. fenced: in a fenced or hidden
    block (a command the reader types), else an inline span or a config's comment. quoted: the
    numbers of the lines that quote what a program printed (a fenced block that is not sh, bash
    or yaml; an indented block), where a name like `model.lora:` is the log's, not a key."""

    def __init__(self, path, rel):
        self.rel = rel
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.pieces, self.quoted = [], set()
        if rel.endswith((".yaml", ".yml")):
            for n, line in enumerate(self.lines, 1):
                if "#" in line:
                    self.pieces.append((n, line[line.index("#") + 1:], False))
            return
        block, start, output, indented = None, 0, False, False
        for n, line in enumerate(self.lines, 1):
            stripped = line.strip()
            if block is None and stripped.startswith("```"):
                block, start = [], n + 1
                output = stripped[3:].split()[:1] not in (["sh"], ["bash"], ["yaml"])
            elif block is not None and stripped.startswith("```"):
                self.pieces.append((start, "\n".join(block), True))
                block = None
            elif block is None and stripped.startswith("<!-- docs-test"):
                block, start, output = [], n + 1, False
            elif block is not None and stripped == "-->":
                self.pieces.append((start, "\n".join(block), True))
                block = None
            elif block is not None:
                block.append(line)
                if output:
                    self.quoted.add(n)
            else:
                indented = line.startswith("    ") and (indented or not self.lines[n - 2].strip())
                if indented:
                    self.quoted.add(n)
                for m in re.finditer(r"`([^`\n]+)`", line):
                    self.pieces.append((n, m.group(1), False))


def previous_token(text, at):
    """The word before position `at` on its (logical) line: the interpreter of a command."""
    line_start = text.rfind("\n", 0, at) + 1
    words = text[line_start:at].split()
    return words[-1] if words else ""


def module_imports(path):
    """The top-level names of every module the file imports (anywhere in it)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


class Scripts:
    """What each script of scripts/ needs: outside_stdlib (imports, through the scripts beside it
    too, a module the standard library lacks), reexecs (project_python.reexec)."""

    def __init__(self, src):
        self.dir = os.path.join(src, "scripts")
        self.siblings = {f[:-3] for f in os.listdir(self.dir) if f.endswith(".py")}
        self._outside = {}

    def path(self, name):
        return os.path.join(self.dir, name)

    def outside_stdlib(self, module, seen=None):
        if module in self._outside:
            return self._outside[module]
        seen = seen or set()
        seen.add(module)
        found = []
        for name in sorted(module_imports(self.path(module + ".py"))):
            if name in self.siblings:
                if name not in seen:
                    found += self.outside_stdlib(name, seen)
            elif name not in sys.stdlib_module_names:
                found.append(name)
        self._outside[module] = sorted(set(found))
        return self._outside[module]

    def reexecs(self, module):
        with open(self.path(module + ".py"), encoding="utf-8") as f:
            return "project_python.reexec(" in f.read()


def check_commands(text, scripts, problems):
    """Rules 1 and the needs of rule 2; returns whether the file needs the --dev tools."""
    needs_dev = False
    for line, body, fenced in text.pieces:
        for m in SCRIPT.finditer(body):
            name = m.group(1)
            where = f"{text.rel}:{line + body.count(chr(10), 0, m.start())}"
            if not os.path.exists(scripts.path(name)):
                problems.append(f"{where}: scripts/{name} does not exist")
                continue
            interp = re.split(r'[$("=]+', previous_token(body, m.start()))[-1]
            if interp in ("source", ".") or VENV_PYTHON.match(interp):
                continue
            direct = not ANY_PYTHON.match(interp)
            if direct and "python" in interp:
                continue  # a virtualenv of the reader's
            if fenced and direct and not os.stat(scripts.path(name)).st_mode & stat.S_IXUSR:
                problems.append(f"{where}: scripts/{name} is run directly but is not executable "
                                "(chmod +x, or run it with its interpreter)")
            if not name.endswith(".py"):
                continue
            module = name[:-3]
            outside = scripts.outside_stdlib(module)
            needs_dev |= bool(outside) and fenced
            if outside and not scripts.reexecs(module):
                problems.append(
                    f"{where}: scripts/{name} imports {', '.join(outside)} (scripts/bootstrap.sh "
                    f"--dev), which `{interp + ' ' if not direct else ''}scripts/{name}` may lack: "
                    f'run it as "$TRAINER_VENV/bin/python" scripts/{name}, or make it run itself '
                    "again under the project's Python (project_python.reexec)")
        if fenced and "$TRAINER_VENV/bin/" in body:
            needs_dev = True
        for m in INLINE_PYTHON.finditer(body):
            if not ANY_PYTHON.match(re.split(r'[$("=]+', m.group("interp"))[-1]):
                continue
            code = m.group("code") if m.group("code") is not None else m.group("dcode")
            if code is None:  # a here-document: its lines up to the tag
                rest = body[m.end():].split("\n")[1:]
                code = "\n".join(rest[:rest.index(m.group("tag"))] if m.group("tag") in rest
                                 else rest)
            try:
                tree = ast.parse(code)
            except SyntaxError:
                continue
            used = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
            used |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module}
            outside = sorted(u for u in used if u not in sys.stdlib_module_names)
            if outside:
                where = f"{text.rel}:{line + body.count(chr(10), 0, m.start())}"
                problems.append(f"{where}: `{m.group('interp')}` runs code that imports "
                                f"{', '.join(outside)}: use \"$TRAINER_VENV/bin/python\"")
    return needs_dev


def check_keys(text, keys, problems):
    """Rule 3: every section.key named in the file is a key (or a key's prefix_*)."""
    sections = {k.split(".")[0] for k in keys}
    pattern = re.compile(r"(?<![\w/.$-])(" + "|".join(sorted(sections)) +
                         r")\.([a-z][a-z0-9_]*)(\*|\.[A-Za-z0-9]|(?![\w-]))")
    for n, line in enumerate(text.lines, 1):
        if n in text.quoted:
            continue
        if text.rel.endswith((".yaml", ".yml")):
            line = line[line.index("#"):] if "#" in line else ""
        for m in pattern.finditer(line):
            section, key, after = m.groups()
            if key in FILE_EXTENSIONS or after.startswith("."):
                continue  # a file (model.safetensors) or a longer dotted name
            name = f"{section}.{key}"
            if after == "*":
                if not any(k.startswith(name) for k in keys):
                    problems.append(f"{text.rel}:{n}: `{name}*` is the start of no key of "
                                    "--help-config")
            elif name not in keys:
                problems.append(f"{text.rel}:{n}: `{name}` is not a key of --help-config")


def main():
    trainer, src = sys.argv[1], sys.argv[2]
    out = subprocess.run([trainer, "--help-config"], capture_output=True, text=True)
    keys = {line.split()[0] for line in out.stdout.splitlines()[1:] if line.strip()}
    if out.returncode != 0 or not keys:
        sys.exit(f"FAIL: {trainer} --help-config printed no keys (exit code {out.returncode})")
    scripts = Scripts(src)
    guides = ["README.md"] + sorted("docs/guides/" + f for f in os.listdir(f"{src}/docs/guides")
                                    if f.endswith(".md"))
    pages = guides + ["CONTRIBUTING.md"] + sorted(
        "docs/" + f for f in os.listdir(f"{src}/docs") if f.endswith(".md"))
    configs = sorted("configs/" + f for f in os.listdir(f"{src}/configs") if f.endswith(".yaml"))
    problems = []
    for rel in pages + configs:
        text = Text(os.path.join(src, rel), rel)
        needs_dev = check_commands(text, scripts, problems)
        if rel in guides and needs_dev and "bootstrap.sh --dev" not in "\n".join(text.lines):
            problems.append(f"{rel}: its commands need what scripts/bootstrap.sh --dev installs "
                            "(the scripts' packages, transformers, peft), and it does not say so")
        if rel in guides + ["docs/language-models.md", "docs/reference.md"] + configs:
            check_keys(text, keys, problems)
    for p in problems:
        print("FAIL:", p)
    if problems:
        sys.exit(1)
    print(f"PASS: the commands of {len(pages) + len(configs)} pages and configs run scripts/ with "
          f"a Python that has their imports; the guides that need --dev say so; every section.key "
          f"they name is one of the {len(keys)} keys of --help-config")


if __name__ == "__main__":
    main()
