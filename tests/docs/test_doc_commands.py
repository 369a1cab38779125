"""Every shell command in the code blocks of README.md and of every page under docs/ (subfolders
included) works as written, from a clean clone; and every relative link between them resolves.

How a document's blocks are run (docs/development.md says the same):

- Each document runs in a clean clone of its own: the files git knows (tracked, or new and not
  ignored) are copied to a temporary directory, as a fresh clone would have them, with ``.venv``
  linked to this checkout's virtualenv; every command runs there with ``bash``, in document order, so
  later commands see what earlier ones of the same document made (``runs/...``), and nothing another
  document made.
- A ```` ```sh ```` block: each line is a command (a trailing ``\\`` continues it; ``#`` comment lines
  are skipped). It must exit 0.
- A ```` ```console ```` block: ``$ command`` lines, each followed by the output the document shows.
  The command runs; every shown line (other than ``...``) must appear in its output, and it may exit
  non-zero only when the shown output has an ``error:`` line.
- A ```` ```python ```` block right after ``<!-- readme-test: file PATH -->`` is written to PATH (in the
  clone) before the next command runs: a tutorial's code is then exactly the code that is tested.
- ``<!-- readme-test: skip (why) -->`` right before a block leaves it out; the reason must be given
  and is shown by pytest. Use it for servers (tensorboard), Bazel, the whole test suite, or runs longer
  than the test can afford.
- Short settings: a command that trains (``-m trainer`` other than ``--mode=inspect_*``, or
  ``tools/dev.py train``) gets ``--params_file_override=SHORT`` appended, where SHORT sets
  ``task.train.max_steps`` to 6 (one save, at 6; warm-up 1 step) and evaluates and decodes 16
  examples per checkpoint: every experiment's task has those settings. A training command may not set
  ``--params_file_override`` itself (use ``--params_override``).

Other blocks (plain ```` ``` ````, output excerpts, ```` ```python ```` without a marker) are not run.

Links: every relative Markdown link in these documents points at a file that exists and, with a
``#anchor``, at a heading of that file (GitHub's anchor for it); every page under docs/ is listed in
docs/index.md.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
DOCUMENTS = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md"))]
SHORT_SETTINGS = """\
task.train.max_steps : 6
task.train.save_interval_steps : 6
task.train.warmup_steps : 1
task.train.log_interval_steps : 3
task.train.summary_interval_steps : 3
task.eval.samples_per_summary : 16
task.decode.samples_per_summary : 16
"""
TIMEOUT = 900
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
MARKER_RE = re.compile(r"<!--\s*readme-test:\s*(skip|file)\s*(.*?)\s*-->")
FENCE_RE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    language: str
    lines: list[str]
    line_no: int
    skip: str | None = None
    file: str | None = None
    commands: list[tuple[str, list[str]]] = field(default_factory=list)  # (command, shown output)


def parse_blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, each with the readme-test marker right before it."""
    blocks, marker, lines = [], None, text.splitlines()
    i = 0
    while i < len(lines):
        match = MARKER_RE.search(lines[i])
        fence = FENCE_RE.match(lines[i])
        if match:
            marker = match.groups()
        elif fence:
            start = i
            body = []
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            block = Block(fence.group(1), body, start + 1)
            if marker and marker[0] == "skip":
                block.skip = marker[1].strip("() ")
                if not block.skip:
                    raise AssertionError(f"line {start + 1}: readme-test: skip needs a reason")
            elif marker:
                block.file = marker[1]
            blocks.append(block)
            marker = None
        elif lines[i].strip():
            marker = None
        i += 1
    for block in blocks:
        block.commands = _commands(block)
    return blocks


def _commands(block: Block) -> list[tuple[str, list[str]]]:
    if block.language == "sh":
        commands, current = [], ""
        for line in block.lines:
            if not current and (not line.strip() or line.lstrip().startswith("#")):
                continue
            current += line.rstrip()
            if current.endswith("\\"):
                current = current[:-1] + " "
                continue
            commands.append((current.strip(), []))
            current = ""
        return commands
    if block.language == "console":
        commands = []
        for line in block.lines:
            if line.startswith("$ "):
                commands.append((line[2:].strip(), []))
            elif commands:
                commands[-1][1].append(line)
        return commands
    return []


def trains(command: str) -> bool:
    if "tools/dev.py train" in command:
        return True
    return bool(re.search(r"-m trainer\b", command)) and "--mode=inspect" not in command


def with_short_settings(command: str, short: Path) -> str:
    if not trains(command):
        return command
    if "--params_file_override" in command:
        raise AssertionError(
            f"{command!r}: a training command in a document may not set --params_file_override"
        )
    head, sep, comment = command.partition(" #")
    return f"{head.rstrip()} --params_file_override={short}" + (f" #{comment}" if sep else "")


def clean_clone(destination: Path) -> Path:
    """The files git knows, copied as a clone would have them, and .venv linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_file() or name == ".venv":
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    (destination / ".venv").symlink_to((REPO / ".venv").resolve())
    return destination


def run_bounded(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``bash -c command`` in its own process group, all of which is killed if it overruns."""
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"{command!r} ran over {TIMEOUT} s") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_document(document: str, clone: Path, short: Path) -> list[str]:
    """Runs a document's blocks in order; returns the skipped blocks' reasons."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    skipped = []
    for block in parse_blocks((REPO / document).read_text()):
        where = f"{document}:{block.line_no}"
        if block.skip:
            skipped.append(f"{where}: {block.skip}")
            continue
        if block.file:
            target = clone / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(block.lines) + "\n")
            continue
        for command, shown in block.commands:
            result = run_bounded(with_short_settings(command, short), clone, env)
            output = result.stdout + result.stderr
            context = f"{where}: {command!r} exited {result.returncode}:\n{output[-3000:]}"
            shows_error = any("error:" in line for line in shown)
            if result.returncode != 0 and not shows_error:
                raise AssertionError(context)
            for line in shown:
                if line.strip() and line.strip() != "..." and line.strip() not in output:
                    raise AssertionError(
                        f"{where}: {command!r} did not print {line.strip()!r}:\n{output[-3000:]}"
                    )
    return skipped


def prose_lines(text: str, keep_code: bool = False) -> list[str]:
    """A Markdown text's lines outside fenced blocks, with inline code spans removed unless kept."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line if keep_code else re.sub(r"(`+).*?\1", "", line))
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: link syntax and punctuation dropped, lower case, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown text's headings (a repeated one gets ``-1``, ``-2``, ... as on GitHub)."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines(text, keep_code=True):
        match = HEADING_RE.match(line)
        if match:
            name = anchor(match.group(1))
            result.add(f"{name}-{seen[name]}" if name in seen else name)
            seen[name] = seen.get(name, 0) + 1
    return result


def relative_links(document: str) -> list[tuple[str, Path, str]]:
    """(link as written, the file it names, its #anchor or "") for each relative link of a document."""
    source = REPO / document
    links = []
    for line in prose_lines(source.read_text()):
        for target in LINK_RE.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            links.append((target, (source.parent / path).resolve() if path else source, fragment))
    return links


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for document in DOCUMENTS:
        for target, path, fragment in relative_links(document):
            if not path.exists():
                broken.append(f"{document}: ({target}): no file {path.relative_to(REPO)}")
            elif fragment and path.suffix == ".md" and fragment not in anchors(path.read_text()):
                broken.append(f"{document}: ({target}): no heading with anchor #{fragment}")
    assert not broken, "\n".join(broken)


def test_docs_index_lists_every_page():
    listed = {path for _, path, _ in relative_links("docs/index.md")}
    pages = {page.resolve() for page in DOCS.rglob("*.md")} - {(DOCS / "index.md").resolve()}
    missing = sorted(str(page.relative_to(REPO)) for page in pages - listed)
    assert not missing, f"pages not listed in docs/index.md: {missing}"


def test_anchors_follow_github():
    text = "# A `tool`: params_diff\n```sh\n# not a heading\n```\n## Mesh or GPipe?\n## Mesh or GPipe?\n"
    assert anchors(text) == {"a-tool-params_diff", "mesh-or-gpipe", "mesh-or-gpipe-1"}
    assert anchor("4. Export it and serve it") == "4-export-it-and-serve-it"
    assert anchor("The documents' commands are tests") == "the-documents-commands-are-tests"
    assert prose_lines("see [x](a.md) and `[y](b.md)`") == ["see [x](a.md) and "]


def test_parse_blocks_markers_and_commands():
    text = """
<!-- readme-test: skip (starts a server) -->
```sh
tensorboard --logdir=runs/x
```

```sh
# a comment
.venv/bin/python -m trainer --model=a.B \\
    --logdir=runs/b
```
<!-- readme-test: file my/exp.py -->
```python
x = 1
```
```console
$ .venv/bin/python -m trainer --bad
trainer: error: bad
```
"""
    blocks = parse_blocks(text)
    assert blocks[0].skip == "starts a server"
    assert blocks[1].commands == [(".venv/bin/python -m trainer --model=a.B      --logdir=runs/b", [])]
    assert blocks[2].file == "my/exp.py" and blocks[2].lines == ["x = 1"]
    assert blocks[3].commands == [(".venv/bin/python -m trainer --bad", ["trainer: error: bad"])]
    short = Path("/s.txt")
    assert with_short_settings("python3 tools/dev.py train", short).endswith("--params_file_override=/s.txt")
    assert with_short_settings(".venv/bin/python -m trainer --mode=inspect_params", short).endswith("params")
    assert trains(".venv/bin/python -m trainer --model=x --logdir=y --job=evaler_dev")


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_command_of_the_document_works_as_written(document, tmp_path):
    clone = clean_clone(tmp_path / "clone")
    short = tmp_path / "short_settings.txt"
    short.write_text(SHORT_SETTINGS)
    skipped = run_document(document, clone, short)
    for reason in skipped:
        print(f"not run: {reason}")
