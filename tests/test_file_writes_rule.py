"""Every file bmoe writes goes through one rule (``bmoe.adapters.file_writes``): a static
check over ``src/bmoe`` that fails when a module writes, renames, or makes temporary files
or folders itself. The few that may are listed below, each with why."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "bmoe"
RULE = "adapters/file_writes.py"

WRITES = {
    "open for writing": re.compile(r"""\bopen\([^)]*["'][rbt]*[wax+][rwabxt+]*["']"""),
    "os.open for writing": re.compile(r"\bos\.open\([^)]*O_(WRONLY|RDWR|CREAT)"),
    "write_bytes/write_text": re.compile(r"\.write_(bytes|text)\("),
    "os.replace/os.rename": re.compile(r"\bos\.(replace|rename|renames)\("),
    "Path.rename/replace": re.compile(r"\.(rename|replace)\((tmp|staging|stale|final|path)\b"),
    "tempfile": re.compile(
        r"\btempfile\.(mkstemp|mkdtemp|NamedTemporaryFile|TemporaryDirectory|TemporaryFile)\("
    ),
    "mkdir": re.compile(r"\.mkdir\(|\bos\.(mkdir|makedirs)\("),
    "numpy save": re.compile(r"\bnp\.(save|savez|savez_compressed|savetxt)\(|\.tofile\("),
    "json.dump to a file": re.compile(r"\bjson\.dump\("),
    "os.write": re.compile(r"\bos\.write\("),
    "shutil copy/move": re.compile(r"\bshutil\.(copy|copy2|copyfile|copytree|move)\("),
}

ALLOWED: dict[str, str] = {
    # outputs a user names, written as they go (a stream, not a file to keep whole): the
    # atomic rule does not fit an append-only log, and a failure is the command's, said
    "adapters/stream_trace.py": "--trace FILE: a CSV written row by row while the run goes",
    "adapters/decide_probe.py": "a decision probe's log the user named, appended line by line",
    "cli/__init__.py": "--csv FILE: the command's per-token CSV, written as tokens come",
    "launch/server.py": "the launched server's log: its stdout, a stream (its key file goes by the rule)",
    # measurements whose writes are what is measured, removed afterwards
    "adapters/disk_reads.py": "the disk read measurement's scratch file: written, fsynced, timed, removed",
    # the bench: reports the user asked for, kernel control files, a test's child
    "bench/main.py": "the bench report (bench.md, bench.json) in --out: the command's output",
    "bench/largest_cache.py": "the largest-cache report in --out: the command's output",
    "bench/drafts.py": "the drafts bench's report in --out: the command's output",
    "bench/runner.py": "bench child output captured through a temporary file; a report the user asked for",
    "bench/trained/main.py": "the trained-model figures and arrays in --out: the command's output",
    "bench/route_capture.py": "the captured routing (.npz) in --out: the command's output",
    "bench/pressure.py": "--log FILE: the pressure bench's log, appended as it runs",
    "bench/cgroup.py": "cgroup control files under /sys/fs/cgroup: the kernel's, not files",
    "bench/io_group.py": "cgroup control files under /sys/fs/cgroup: the kernel's, not files",
    "bench/procfs.py": "/proc/self/clear_refs: the kernel's control file, not a file",
    # written by the rule, slice by slice at their offsets into the rule's temporary file
    "adapters/expert_store_file.py": "the expert store: pwrite at each slice's offset into the temporary "
    "file file_writes.replacing gives, flushed and renamed into place by the rule",
    # the test oracle: a child's logits handed back through a scratch folder it removes
    "testing/oracle.py": "the oracle child's logits, passed back through a scratch folder removed at once",
}


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """``path``'s lines of code: comments dropped, docstrings and other strings' text kept
    only where they hold an expression (a crude but sufficient filter for these patterns)."""
    out = []
    in_doc = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""') + stripped.count("'''")
        if in_doc:
            if quotes % 2 == 1:
                in_doc = False
            continue
        if stripped.startswith(('"""', "'''")):
            in_doc = quotes % 2 == 1
            continue
        out.append((n, line.split("  #", 1)[0]))
    return out


def _writes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == RULE:
            continue
        for n, line in _code_lines(path):
            for what, pattern in WRITES.items():
                if pattern.search(line):
                    found.setdefault(rel, []).append(f"{rel}:{n}: {what}: {line.strip()}")
    return found


def test_no_module_but_the_rule_writes_files_itself() -> None:
    bypass = {rel: hits for rel, hits in _writes().items() if rel not in ALLOWED}
    assert not bypass, (
        "write through bmoe.adapters.file_writes (docs/reliability.md), or allow it here with why:\n"
        + ("\n".join(hit for hits in bypass.values() for hit in hits))
    )


def test_every_allowed_module_still_writes() -> None:
    """The allow-list stays short and true: a module that no longer writes leaves it."""
    stale = sorted(rel for rel in set(ALLOWED) - set(_writes()) if (SRC / rel).exists())
    assert not stale, f"these no longer write files themselves; remove them from ALLOWED: {stale}"


def test_the_check_sees_each_kind_of_write(tmp_path: Path) -> None:
    """The patterns catch what they are for (a check that cannot fail proves nothing)."""
    samples = {
        "open for writing": 'with open(path, "wb") as f:',
        "os.open for writing": "fd = os.open(path, os.O_WRONLY | os.O_CREAT)",
        "write_bytes/write_text": "path.write_text(text)",
        "os.replace/os.rename": "os.replace(tmp, path)",
        "Path.rename/replace": "tmp.replace(path)",
        "tempfile": "fd, tmp = tempfile.mkstemp(dir=folder)",
        "mkdir": "folder.mkdir(parents=True, exist_ok=True)",
        "numpy save": "np.save(out, logits)",
        "json.dump to a file": "json.dump(doc, out)",
        "os.write": "os.write(fd, chunk)",
        "shutil copy/move": "shutil.copyfile(a, b)",
    }
    assert set(samples) == set(WRITES)
    for what, line in samples.items():
        assert WRITES[what].search(line), what
    assert not WRITES["open for writing"].search('with open(path, "rb") as f:')
    assert not WRITES["os.open for writing"].search("fd = os.open(path, os.O_RDONLY)")
