"""The manual (README.md and docs/*.md) against the code, so that it cannot drift silently.

- every setting it names (``section.key``, ``HWPROFILE_SECTION__KEY``) is declared
  (:data:`hwprofile.config.schema.SETTINGS`), and every ``yaml`` example of settings validates;
- every default it states is the declared one, in the two forms the manual uses: a row of a
  ``| setting | default | ...`` table, and a number in parentheses right after a setting's name
  (`` `bench.rounds` (3) ``; so a number in parentheses after a setting is always its default);
- docs/planning.md's settings table lists every declared setting;
- every ``hwprofile <command>`` in code is a command of the parser (``_commands()``), and the
  README's command table has one row per command;
- every relative link resolves (file and ``#anchor``), every repository path in code exists, and the
  README's "Read on" list links every docs page;
- docs/architecture.md's table of layers names every package and module of ``hwprofile/``, lowest
  first: each imports only the rows above it;
- the README has at most 150 lines, no line of README.md or docs/*.md is over 110 characters (the two
  setup commands excepted: CI runs them verbatim), and CI's test command is where CI looks for it.

Fast: reads text files and imports the settings and the parser; no network, no vLLM.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hwprofile.cli.parser import _commands
from hwprofile.config import ConfigError, Source
from hwprofile.config.schema import PROFILE_ONLY, SECTIONS, SETTINGS, Field, validate

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
COMMANDS = {c[0] for c in _commands()}

MAX_README_LINES = 150
MAX_LINE = 110
TEST_COMMAND = (
    "<!-- test-command -->\n```sh\n"
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test,cpu]' && .venv/bin/hwprofile doctor --fix"
    " && .venv/bin/pytest\n```\n"
)
SETUP_MARKERS = ("<!-- main-command -->", "<!-- test-command -->")

# A `section.key` not preceded by a word, a dot, a slash or a dash (not `hwprofile.verify/1`, not
# `cli/verify.py`); a file name with a section's name (`bench.json`) is no setting.
_SETTING = re.compile(r"(?<![\w./-])(" + "|".join(sorted(SECTIONS)) + r")\.([a-z_][a-z0-9_]*)\b(?![/(])")
_FILE_SUFFIXES = {"json", "png", "yaml", "yml", "py", "md", "log", "lock", "service", "conf", "j2", "txt"}
_ENV = re.compile(r"\bHWPROFILE_([A-Z]+)__([A-Z0-9_]+)\b")
_NUMBER = r"-?\d+(?:\.\d+)?"
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_UNIT = r"KiB|MiB|GiB|s|ms|°C|%"
_VALUE = re.compile(rf"^({_NUMBER})(?:\s*({_UNIT}))?$")
_PROSE_DEFAULT = re.compile(
    rf"`([a-z_]+\.[a-z_][a-z0-9_]*)`\s+\((true|false|{_NUMBER}(?:\s*(?:{_UNIT})(?!\w))?)"
)
_COMMAND = re.compile(r"(?:^|[\s/(])hwprofile ([a-z][a-z-]*)", re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(
    r"^(?:hwprofile|tests|schemas|systemd|profiles|templates|tools|benchmarks|dashboards|docs)/[\w./-]*$"
)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _fences(text: str) -> tuple[str, list[tuple[int, str, str]]]:
    """(the text with every fenced block's lines blanked, [(first line, language, content)])."""
    out, blocks, block, lang, start = [], [], None, "", 0
    for n, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            if block is None:
                block, lang, start = [], line[3:].strip(), n + 1
            else:
                blocks.append((start, lang, "\n".join(block)))
                block = None
            out.append("")
        elif block is not None:
            block.append(line)
            out.append("")
        else:
            out.append(line)
    return "\n".join(out), blocks


def _code(text: str) -> list[tuple[int, str]]:
    """Every inline code span and fenced block: (line, content)."""
    prose, blocks = _fences(text)
    spans = [(_line(prose, m.start()), m.group(2)) for m in re.finditer(r"(`+)(.+?)\1", prose, re.S)]
    return spans + [(start, content) for start, _, content in blocks]


# -- settings and defaults ------------------------------------------------------------------------


def setting_names(text: str) -> list[tuple[int, str]]:
    """Every setting the text names: (line, dotted name)."""
    found = [
        (_line(text, m.start()), f"{m.group(1)}.{m.group(2)}")
        for m in _SETTING.finditer(text)
        if m.group(2) not in _FILE_SUFFIXES
    ]
    found += [(_line(text, m.start()), f"{m.group(1)}.{m.group(2)}".lower()) for m in _ENV.finditer(text)]
    return found


def _parse_default(spec: Field, stated: str) -> Any:
    """A default as the manual writes it (`` `auto` ``, `` `true` ``, ``unset``, ``768 MiB``, ``1 s``)
    → the value it states; ValueError when it is in no known form."""
    stated = stated.strip()
    if stated == "unset":
        return None
    if stated in ("`true`", "`false`", "true", "false"):
        return stated.strip("`") == "true"
    if stated == "`[]`":
        return ()
    if len(stated) > 2 and stated[0] == stated[-1] == "`":
        return stated[1:-1]
    m = _VALUE.match(stated)
    if not m:
        raise ValueError(f"cannot read the default {stated!r}")
    number = float(m.group(1))
    if spec.kind == "size":
        number *= _UNITS.get(m.group(2) or "", 1)
    return number


def _same(spec: Field, value: Any) -> bool:
    default = spec.default
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, (int, float)):
        return isinstance(value, float) and value == float(default)
    if isinstance(default, tuple):
        return value == default
    return value == default


def _show(spec: Field) -> str:
    d = spec.default
    return "unset" if d is None else str(d).lower() if isinstance(d, bool) else repr(d)


def settings_tables(text: str) -> list[tuple[int, str, str]]:
    """Every row of a ``| setting | default | ...`` table: (line, name, stated default)."""
    rows: list[tuple[int, str, str]] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not re.match(r"^\|\s*setting\s*\|\s*default\s*\|", line):
            continue
        for n in range(i + 2, len(lines)):  # after the header and its --- row
            if not lines[n].startswith("|"):
                break
            cells = [c.strip() for c in lines[n].strip().strip("|").split("|")]
            rows.append((n + 1, cells[0].strip("`"), cells[1] if len(cells) > 1 else ""))
    return rows


def default_problems(text: str, where: str) -> list[str]:
    """Every stated default that is not the declared one, or cannot be read, or names no setting."""
    problems = []
    stated = settings_tables(text)
    stated += [(_line(text, m.start()), m.group(1), m.group(2)) for m in _PROSE_DEFAULT.finditer(text)]
    for line, name, value in stated:
        spec = SETTINGS.get(tuple(name.split(".")))
        if spec is None:
            problems.append(f"{where}:{line}: a default for `{name}`, which is no setting")
            continue
        try:
            parsed = _parse_default(spec, value)
        except ValueError as e:
            problems.append(f"{where}:{line}: `{name}`: {e}")
            continue
        if not _same(spec, parsed):
            problems.append(f"{where}:{line}: `{name}` defaults to {_show(spec)}, the manual says {value!r}")
    return problems


def name_problems(text: str, where: str) -> list[str]:
    return [
        f"{where}:{line}: `{name}` is no setting"
        for line, name in setting_names(text)
        if tuple(name.split(".")) not in SETTINGS
    ]


def yaml_problems(text: str, where: str) -> list[str]:
    """Every ``yaml`` example whose top level is settings must validate as a profile or overrides file."""
    problems = []
    for start, lang, content in _fences(text)[1]:
        if lang not in ("yaml", "yml"):
            continue
        data = yaml.safe_load(content)
        top = {p[0] for p in SETTINGS} | {p[0] for p in PROFILE_ONLY}
        if not isinstance(data, dict) or not set(map(str, data)) & top:
            continue
        try:
            validate(data, lambda path, start=start: Source("docs", where, start), PROFILE_ONLY)
        except ConfigError as e:
            problems += e.messages()
    return problems


# -- commands, links, paths -----------------------------------------------------------------------


def command_problems(text: str, where: str) -> list[str]:
    return [
        f"{where}:{line}: `hwprofile {m.group(1)}` is no command (commands: {', '.join(sorted(COMMANDS))})"
        for line, code in _code(text)
        for m in _COMMAND.finditer(code)
        if m.group(1) not in COMMANDS
    ]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", _fences(text)[0], re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def link_problems(text: str, page: Path) -> list[str]:
    problems = []
    prose = _fences(text)[0]
    for m in _LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{_rel(page)}:{_line(prose, m.start())}"
        if not dest.exists():
            problems.append(f"{where}: link to {target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text())):
            problems.append(f"{where}: link to {target}: no heading #{anchor} there")
    return problems


def path_problems(text: str, where: str) -> list[str]:
    return [
        f"{where}:{line}: `{code}` does not exist"
        for line, code in _code(text)
        if _REPO_PATH.match(code) and not (ROOT / code).exists()
    ]


# -- the layers -----------------------------------------------------------------------------------


def layers(text: str) -> list[set[str]]:
    """The table under "## The layers, lowest first": per row, the units it names (``config`` for
    `` `hwprofile/config/` ``, ``errors`` for `` `hwprofile/errors.py` ``)."""
    section = text[text.index("## The layers, lowest first") :]
    rows = []
    for line in section.split("\n"):
        if rows and not line.startswith("|"):
            break
        if line.startswith("| `hwprofile/"):
            first = line.strip("|").split("|")[0]
            rows.append(set(re.findall(r"`hwprofile/(\w+)(?:/|\.py)`", first)))
        elif line.startswith("| ---"):
            rows.append(set())  # the header's end: rows follow
    return [r for r in rows if r]


def units() -> dict[str, list[Path]]:
    """Every package and top-level module of ``hwprofile/`` and its source files."""
    pkg = ROOT / "hwprofile"
    out: dict[str, list[Path]] = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).parts
        if "__pycache__" in rel or rel[0] in ("__init__.py", "__main__.py"):
            continue
        out.setdefault(rel[0].removesuffix(".py"), []).append(path)
    return out


def imported_units(path: Path) -> set[str]:
    """The units of ``hwprofile`` that a file imports (lazy and TYPE_CHECKING imports included)."""
    pkg = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[tuple[str, ...]] = []
        if isinstance(node, ast.Import):
            targets = [tuple(a.name.split(".")) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[: len(pkg) - node.level + 1]
            if node.module:
                targets = [base + tuple(node.module.split("."))]
            else:
                targets = [(*base, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            targets = [tuple(node.module.split("."))]
        found |= {t[1] for t in targets if len(t) > 1 and t[0] == "hwprofile"}
    return found


# -- the tests ------------------------------------------------------------------------------------


def test_the_manual_has_its_pages() -> None:
    names = {p.name for p in DOCS}
    expected = {
        "planning.md",
        "rendering.md",
        "supervision.md",
        "daemon.md",
        "service.md",
        "bench-and-verify.md",
        "architecture.md",
        "benchmarks.md",
    }
    assert expected <= names, expected - names


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_setting_named_exists(page: Path) -> None:
    text = page.read_text()
    problems = name_problems(text, _rel(page)) + yaml_problems(text, _rel(page))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_stated_default_is_the_declared_one(page: Path) -> None:
    problems = default_problems(page.read_text(), _rel(page))
    assert not problems, "\n".join(problems)


def test_the_settings_table_lists_every_setting() -> None:
    page = ROOT / "docs" / "planning.md"
    listed = [name for _, name, _ in settings_tables(page.read_text())]
    declared = [".".join(p) for p in SETTINGS]
    missing = [n for n in declared if n not in listed]
    assert not missing, f"add these settings to {_rel(page)}'s settings table: {missing}"
    twice = sorted({n for n in listed if listed.count(n) > 1})
    assert not twice, f"listed more than once: {twice}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_command_named_exists(page: Path) -> None:
    problems = command_problems(page.read_text(), _rel(page))
    assert not problems, "\n".join(problems)


def test_the_readme_table_has_one_row_per_command() -> None:
    text = README.read_text()
    rows = re.findall(r"^\| `hwprofile ([a-z-]+)`", text, re.M)
    assert sorted(rows) == sorted(COMMANDS), set(rows) ^ COMMANDS
    assert len(rows) == len(set(rows)), rows


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_link_and_path_resolves(page: Path) -> None:
    text = page.read_text()
    problems = link_problems(text, page) + path_problems(text, _rel(page))
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_docs_page() -> None:
    text = README.read_text()
    start = text.index("## Read on")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _LINK.findall(section)}
    missing = [_rel(p) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"the README's Read on list does not link {missing}"


def _setup_lines(text: str) -> set[int]:
    """The lines of the two setup commands (CI and the first run take them verbatim)."""
    lines: set[int] = set()
    for marker in SETUP_MARKERS:
        m = re.search(re.escape(marker) + r"\n```sh\n(.*?)\n```", text, re.S)
        assert m, f"README.md: no ```sh block right after {marker}"
        first = _line(text, m.start(1))
        lines |= set(range(first, first + m.group(1).count("\n") + 1))
    return lines


def test_readme_is_short() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move text to docs/"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_line_is_too_long(page: Path) -> None:
    text = page.read_text()
    exempt = _setup_lines(text) if page == README else set()
    long = [
        f"{_rel(page)}:{n}: {len(line)} characters"
        for n, line in enumerate(text.splitlines(), 1)
        if len(line) > MAX_LINE and n not in exempt
    ]
    assert not long, "\n".join(long)


def test_the_test_command_is_where_ci_finds_it() -> None:
    """`.ci/run` takes the first ```sh block after the marker and runs it verbatim."""
    text = README.read_text()
    assert text.count("<!-- test-command -->") == 1
    assert TEST_COMMAND in text, "README.md: the test command block changed (CI runs it verbatim)"


# -- the checks themselves can fail ---------------------------------------------------------------


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    wrong = (
        "| setting | default | what |\n| --- | --- | --- |\n"
        "| `engine.max_num_seqs` | 255 | off by one |\n"
        "| `engine.kv_cache_dtype` | `fp8` | a wrong choice |\n"
        "| `memory.margin_bytes` | 255 MiB | a wrong size |\n"
        "| `engine.enforce_eager` | `true` | a wrong boolean |\n"
        "| `engine.max_num_seqz` | 256 | no such setting |\n"
        "| `engine.max_model_len` | many | unreadable |\n\n"
        "Prose: `bench.rounds` (4) rounds, `watch.interval` (2 s), `verify.min_similarity` (0.99; x).\n"
    )
    assert len(default_problems(wrong, "x.md")) == 9, default_problems(wrong, "x.md")
    right = wrong.replace("255 |", "256 |").replace("`fp8`", "`auto`").replace("255 MiB", "256 MiB")
    right = right.replace("| `true` |", "| `false` |").replace("seqz", "seqs").replace("many", "8192")
    right = right.replace("(4)", "(3)").replace("(2 s)", "(1 s)").replace("(0.99;", "(0.992;")
    assert default_problems(right, "x.md") == []

    names = "`engine.max_num_seqz`, `--set watch.hot=80`, HWPROFILE_WATCH__HOTC, `bench.json`, `watch.*`"
    assert [p.split(": ")[1] for p in name_problems(names, "x.md")] == [
        "`engine.max_num_seqz` is no setting",
        "`watch.hot` is no setting",
        "`watch.hotc` is no setting",
    ]
    assert yaml_problems("```yaml\nengine:\n  max_num_seqz: 4\n```\n", "x.md")
    assert not yaml_problems("```yaml\nextends: base\nengine:\n  max_num_seqs: 4\n```\n", "x.md")

    assert command_problems("`hwprofile lanuch --demo` and\n```sh\nhwprofile stop\n```\n", "x.md") == [
        f"x.md:1: `hwprofile lanuch` is no command (commands: {', '.join(sorted(COMMANDS))})"
    ]
    page = tmp_path / "page.md"
    page.write_text("# A `title`: here\n\n[ok](#a-title-here) [bad](#nowhere) [gone](missing.md)\n")
    assert [p.split(": ", 1)[1] for p in link_problems(page.read_text(), page)] == [
        "link to #nowhere: no heading #nowhere there",
        "link to missing.md: no such file",
    ]
    assert path_problems("`hwprofile/nowhere.py` and `hwprofile/config/`", "x.md") == [
        "x.md:1: `hwprofile/nowhere.py` does not exist"
    ]


def test_the_layers_name_every_package_and_module() -> None:
    rows = layers((ROOT / "docs" / "architecture.md").read_text())
    listed = [u for row in rows for u in row]
    missing = sorted(set(units()) - set(listed))
    assert not missing, f"docs/architecture.md's table of layers lacks hwprofile/{missing}"
    assert len(listed) == len(set(listed)), (
        f"listed twice: {sorted({u for u in listed if listed.count(u) > 1})}"
    )


def test_each_layer_imports_only_the_rows_above_it() -> None:
    rows = layers((ROOT / "docs" / "architecture.md").read_text())
    level = {u: n for n, row in enumerate(rows) for u in row}
    problems = [
        f"{_rel(path)} imports hwprofile.{dep}, listed below (or beside) hwprofile/{unit} "
        "in docs/architecture.md: move the row, or the import"
        for unit, paths in units().items()
        if unit in level
        for path in paths
        for dep in sorted(imported_units(path))
        if dep != unit and dep in level and level[dep] >= level[unit]
    ]
    assert not problems, "\n".join(problems)
