#!/usr/bin/env python3
"""Structure rules of src/ that no compiler checks, for scripts/lint.sh (docs/DESIGN.md, "Layers"
and "Configuration").

    scripts/lint_structure.py includes [FILE ...]   # no two files of a folder include each other
    scripts/lint_structure.py defaults [FILE ...]   # options structs repeat no schema default
    scripts/lint_structure.py unity [FILE ...]      # test files: no `namespace {`
    scripts/lint_structure.py citations FILE ...    # DESIGN.md sections cited exist
    scripts/lint_structure.py contents              # DESIGN.md's contents list = its headings
    scripts/lint_structure.py names [FILE ...]      # no class name defined twice in src/

FILE: the files to read (scripts/lint.sh passes those git tracks); without them, every .h and
.cpp under src/. Each problem is one line naming the file and line; the exit code is 1 if any.

includes: a file's stem (dir/name, its .h and .cpp counted together) must not include a stem of
its own folder that includes it back: one of them belongs below the other (a factory that pulls
concrete types into a base file goes to a file of its own, as models/registry.cpp and
data/registry.cpp). Standing exceptions are listed in KNOWN_PAIRS, each with its reason.

defaults: the schema (src/config/schema_*.cpp) is the one place for defaults. A field of a
struct that config::Config holds (src/config/run_config.h), or of a struct such a field holds,
whose value the schema declares (FIELD(section.key) or an accessor naming c.section.key) must have
no initialiser but a zero value (0, 0.0, false, "", {}, nullptr, T{}): a second default there
would silently disagree with the schema's for code that builds the struct without it.

names: no two classes of src/ share a name, whatever their namespaces (models::UnitGate and
train::UnitGate were two): one meaning per name. Nested classes (X::Impl) are their class's own.

contents: docs/DESIGN.md opens with a contents list of its ## and ### headings, in order, and
no section (from a heading to the next) runs over 100 lines.

citations: code and pages cite a section of docs/DESIGN.md by its title (`docs/DESIGN.md,
"Checkpoints"`) or link its anchor (`DESIGN.md#checkpoints`); each must name a heading that
exists, so a section renamed or split takes its citations along.

unity: the test binaries compile in unity batches (docs/DESIGN.md, "Tests and benchmarks"), where
the anonymous namespaces of a batch's files are one namespace; a test file (tests/unit, tests/mpi,
tests/gpu) keeps its helpers in `namespace TRAINER_UNITY_ID {` instead, a namespace of its own.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

# Mutual includes that stand for now, each with its reason (none).
KNOWN_PAIRS = set()

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(args):
    files = [Path(a) for a in args] if args else sorted(Path("src").rglob("*"))
    return [f for f in files if f.suffix in (".h", ".cpp") and f.parts[0] == "src" and f.is_file()]


def stem_of(path):
    return str(Path(*path.parts[1:]).with_suffix(""))


def check_includes(files):
    """Pairs of stems of one folder that include each other (KNOWN_PAIRS aside)."""
    edges = defaultdict(dict)  # stem -> {included stem: "file:line"}
    read = {stem_of(f) for f in files}
    for f in files:
        stem = stem_of(f)
        text = f.read_text()
        for m in INCLUDE.finditer(text):
            target = str(Path(m.group(1)).with_suffix(""))
            if target != stem and Path(target).parent == Path(stem).parent:
                line = text.count("\n", 0, m.start()) + 1
                edges[stem].setdefault(target, f"{f}:{line}")
    problems = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if a < b and a in edges.get(b, {}) and (a, b) not in KNOWN_PAIRS:
                problems.append(
                    f"{edges[a][b]}: {a} and {b} include each other ({edges[b][a]}): one of them "
                    "belongs below the other (docs/DESIGN.md, \"Layers\")"
                )
    for a, b in sorted(KNOWN_PAIRS):
        stale = b not in edges.get(a, {}) or a not in edges.get(b, {})
        if stale and a in read and b in read:
            problems.append(
                f"scripts/lint_structure.py: {a} and {b} no longer include each other: delete "
                "their row of KNOWN_PAIRS"
            )
    return problems


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def struct_bodies(files):
    """{name: (file, line of the body's start, body text)} of every `struct NAME {` in src/."""
    found = {}
    for f in files:
        if f.suffix != ".h":
            continue
        text = strip_comments(f.read_text())
        for m in re.finditer(r"\bstruct\s+(\w+)\s*(?:final\s*)?\{", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            line = text.count("\n", 0, m.end()) + 1
            found.setdefault(m.group(1), (f, line, text[m.end() : i - 1]))
    return found


FUNCTION_HEAD = re.compile(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(final\s*)?$")
MEMBER = re.compile(r"^(?P<type>[\w:<>,\s*&]+?)\s+(?P<name>\w+)\s*(?P<init>=.*|\{.*\})?$", re.S)
ZERO = re.compile(
    r'^(=\s*)?(0|0\.0*|0\.?0*f|0u|false|nullptr|""|\{\s*(0|""|false)?\s*\}|[\w:]+\{\})$'
)


def members(body, first_line):
    """(name, type, initialiser or None, line) of a struct body's data members."""
    out, statement, start, depth, i = [], "", None, 0, 0
    line = first_line
    while i < len(body):
        c = body[i]
        if c == "\n":
            line += 1
        if c == "{" and depth == 0 and FUNCTION_HEAD.search(statement.strip()):
            # A member function's body: skip it, and the declaration before it.
            depth, i = 1, i + 1
            while depth and i < len(body):
                depth += {"{": 1, "}": -1}.get(body[i], 0)
                line += body[i] == "\n"
                i += 1
            statement, start = "", None
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == ";" and depth == 0:
            s = " ".join(statement.split())
            m = MEMBER.match(s)
            keyword = s.split(" ", 1)[0] if s else ""
            if m and "(" not in m.group("type") and keyword not in ("static", "using", "friend"):
                init = m.group("init")
                if init and init.startswith("="):
                    init = init[1:].strip()
                out.append((m.group("name"), m.group("type").strip(), init, start or line))
            statement, start = "", None
        else:
            if start is None and not c.isspace():
                start = line
            statement += c
        i += 1
    return out


def check_defaults(files):
    structs = struct_bodies(files)
    config = structs.get("Config")
    if config is None:
        return ["src/config/run_config.h: no struct Config found"]
    section_type = {name: t.split("::")[-1] for name, t, _, _ in members(config[2], config[1])}
    # The fields the schema sets: (section, key) -> where.
    declared = {}
    for f in files:
        if f.parent.name == "config" and f.name.startswith("schema"):
            text = f.read_text()
            for m in re.finditer(r"FIELD\((\w+)\.(\w+)\)|\bc\.(\w+)\.(\w+)\b", text):
                section, key = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
                line = text.count("\n", 0, m.start()) + 1
                declared.setdefault((section, key), f"{f}:{line}")
    problems = []

    def judge(struct, field, where, path, seen):
        file, line, body = structs[struct]
        fields = members(body, line)
        if field is not None and field not in {f[0] for f in fields}:
            problems.append(f"{where}: {path}: no field {field} found in {struct} ({file})")
        for name, ftype, init, at in fields:
            if name != field and field is not None:
                continue
            if init is not None and not ZERO.match(init.strip()):
                problems.append(
                    f"{file}:{at}: {struct}::{name} = {init} repeats a default the schema "
                    f"declares ({path}: {where}); leave a zero value there (docs/DESIGN.md, "
                    '"Configuration")'
                )
            inner = ftype.split("::")[-1]
            if inner in structs and inner not in seen:  # a struct the key sets whole
                judge(inner, None, where, path, seen | {inner})

    for (section, key), where in sorted(declared.items()):
        struct = section_type.get(section)
        if struct not in structs:
            problems.append(f"{where}: {section}.{key}: no struct for Config::{section} found")
            continue
        judge(struct, key, where, f"{section}.{key}", {struct})
    return problems


ANONYMOUS = re.compile(r"^\s*namespace\s*\{", re.M)


def check_unity(files):
    """Test files that open an anonymous namespace (use namespace TRAINER_UNITY_ID)."""
    problems = []
    for f in files:
        text = strip_comments(Path(f).read_text())
        for m in ANONYMOUS.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(
                f"{f}:{line}: `namespace {{` in a test file: write `namespace TRAINER_UNITY_ID {{` "
                "(a namespace of its own in a unity batch)"
            )
    return problems


# A citation of a section: DESIGN.md, "Layers" (the quotes may be escaped, in a C++ string, and
# the title may start on the next comment line), or a Markdown link to DESIGN.md#layers.
CITATION = re.compile(r'DESIGN\.md,?(?:[ \t]|\n[ \t]*(?://|#|\*)?)*\\?"([^"\\\s][^"\\\n]*)\\?"')
ANCHOR = re.compile(r"DESIGN\.md#([A-Za-z0-9_-]+)")
HEADING = re.compile(r"^#+[ \t]+(.+?)[ \t]*$", re.M)
DESIGN = Path("docs/DESIGN.md")


def anchor_of(title):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def check_citations(files):
    """Citations of DESIGN.md sections that name no heading of it (a heading renamed or never
    there: the reader finds nothing)."""
    titles = set(HEADING.findall(DESIGN.read_text()))
    anchors = {anchor_of(t) for t in titles}
    problems = []
    for f in files:
        text = Path(f).read_text(errors="replace")
        for m in CITATION.finditer(text):
            if m.group(1) not in titles:
                line = text.count("\n", 0, m.start(1)) + 1
                title = m.group(1)
                problems.append(f'{f}:{line}: cites docs/DESIGN.md, "{title}": no such heading')
        for m in ANCHOR.finditer(text):
            if m.group(1) not in anchors:
                line = text.count("\n", 0, m.start(1)) + 1
                problems.append(f"{f}:{line}: links docs/DESIGN.md#{m.group(1)}: no such heading")
    return problems


# A class defined at a namespace's top level (this code does not indent namespaces; a nested
# class is indented, a forward declaration ends with ';', a specialisation carries '<').
DEFINITION = re.compile(
    r"^(?:struct|class)\s+(?:\[\[\w+\]\]\s+)?(\w+)\b(?![<:;]|\s*;)[^;\n]*$", re.M)


def check_names(files):
    """Class names defined twice in src/, in any namespaces: a reader (and grep) must not meet
    two things of one name (docs/DESIGN.md, "Glossary")."""
    where = defaultdict(list)
    for f in files:
        text = strip_comments(Path(f).read_text())
        for m in DEFINITION.finditer(text):
            where[m.group(1)].append(f"{f}:{text.count(chr(10), 0, m.start()) + 1}")
    return [f"{places[0]}: class {name} is defined {len(places)} times: {', '.join(places)} "
            "(give each its own name)" for name, places in sorted(where.items()) if len(places) > 1]


MAX_SECTION_LINES = 100
CONTENTS_ITEM = re.compile(r"^( *)- \[(.+)\]\(#([A-Za-z0-9_-]+)\)$")


def check_contents(files):
    """docs/DESIGN.md's contents list (the list after **Contents**) against its headings: each
    ## and ### heading in order, linked by its anchor, nested by level."""
    text = DESIGN.read_text()
    start = text.find("**Contents**")
    if start < 0:
        return [f"{DESIGN}:1: no **Contents** list"]
    after = text.index("\n## ", start)
    listed = []
    for line in text[start:after].splitlines()[1:]:
        m = CONTENTS_ITEM.match(line)
        if m:
            listed.append((len(m.group(1)) // 2 + 2, m.group(2), m.group(3)))
    heads = [(len(m.group(1)), m.group(2))
             for m in re.finditer(r"^(#{2,3})[ \t]+(.+?)[ \t]*$", text[after:], re.M)]
    want = [(level, title, anchor_of(title)) for level, title in heads]
    problems = []
    if listed != want:
        line = text.count("\n", 0, start) + 1
        fix = "\n".join("  " * (lv - 2) + f"- [{t}](#{a})" for lv, t, a in want)
        problems.append(
            f"{DESIGN}:{line}: the contents list differs from the headings; it should read:\n{fix}")
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"#{1,3} ", line)] + [len(lines)]
    for a, b in zip(starts, starts[1:], strict=False):
        if b - a > MAX_SECTION_LINES:
            problems.append(f"{DESIGN}:{a + 1}: section \"{lines[a].lstrip('# ')}\" runs {b - a} "
                            f"lines (at most {MAX_SECTION_LINES}: split it into ### sections)")
    return problems


CHECKS = {
    "includes": check_includes,
    "defaults": check_defaults,
    "unity": check_unity,
    "citations": check_citations,
    "contents": check_contents,
    "names": check_names,
}


def main(argv):
    if not argv or argv[0] not in CHECKS:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0] == "unity":
        files = [Path(a) for a in argv[1:]] or sorted(Path("tests").glob("*/*.cpp"))
    elif argv[0] == "citations":  # this file's own patterns aside
        files = [Path(a) for a in argv[1:] if Path(a).resolve() != Path(__file__).resolve()]
    else:
        files = sources(argv[1:])
    problems = CHECKS[argv[0]](files)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
