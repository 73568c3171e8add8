"""Build the English training corpus for the demo models from the Python documentation.

Source: the reStructuredText sources of the Python 3.11 documentation as shipped by Debian
(package ``python3.11-doc``, version pinned below) and the docstrings of the standard library
(packages ``libpython3.11-minimal`` and ``libpython3.11-stdlib``), all under the PSF License
Agreement (see docs/DEMO_MODELS.md). The markup is stripped down to prose paragraphs; code samples,
tables, index entries and directives are dropped because a tiny model trained on them
produces punctuation soup rather than readable sentences.

The output is deterministic for a given .deb (sorted file order, no timestamps, gzip mtime 0):
a gzip-compressed JSON-lines file whose records are either ``{"text": ...}`` (one document) or
``{"messages": [...]}`` (a short chat built from a section heading and its first paragraphs, so
the models learn the chat template and to stop with ``<|im_end|>``).

Usage (on a machine with apt access; the GPU machine has none, so build here and carry it):

    cd .train && apt-get download python3.11-doc=3.11.2-6+deb12u8 \
        libpython3.11-minimal=3.11.2-6+deb12u8 libpython3.11-stdlib=3.11.2-6+deb12u8 && cd ..
    python tools/demo_corpus.py --deb .train/python3.11-doc_3.11.2-6+deb12u8_all.deb \
        --stdlib-deb .train/libpython3.11-minimal_3.11.2-6+deb12u8_amd64.deb \
        --stdlib-deb .train/libpython3.11-stdlib_3.11.2-6+deb12u8_amd64.deb --out .train/corpus.jsonl.gz \
        --words-out tests/unit/demo_corpus_words.txt
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import inspect
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

DEB_VERSION = "3.11.2-6+deb12u8"
SOURCES_PREFIX = "./usr/share/doc/python3.11/html/_sources/"
# Sections of the documentation that are mostly prose. The C API and the licence pages are left out:
# the first is dominated by C identifiers, the second is legal boilerplate.
KEEP_DIRS = tuple(
    f"{d}/"
    for d in "tutorial howto faq library reference using whatsnew extending installing distributing".split()
)
KEEP_FILES = ("glossary.rst.txt", "about.rst.txt", "bugs.rst.txt")
# Directives whose indented body is code, markup or metadata rather than prose.
SKIP_BODY_DIRECTIVES = set(
    """
    code-block sourcecode code doctest testcode testoutput testsetup testcleanup productionlist
    literalinclude toctree index csv-table table list-table highlight raw only sectionauthor
    moduleauthor image figure include opcode cmdoption option audit-event impl-detail tabularcolumns
    rubric math
    """.split()
)
STDLIB_PREFIX = "./usr/lib/python3.11/"
SKIP_PACKAGES = set("test tests idle_test lib2to3 idlelib turtledemo site-packages dist-packages".split())
HEADING_CHARS = set("=-~^\"*#+'`:.")
CHAT_QUESTIONS = (
    "What is {t}?",
    "Tell me about {t}.",
    "Can you explain {t}?",
    "Describe {t}.",
    "What should I know about {t}?",
)


@dataclass
class Block:
    """A run of non-blank lines; `indent` is the indentation of its first line."""

    indent: int
    lines: list[str]


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)


def read_deb(deb_path: Path, keep) -> dict[str, str]:
    """Return {path inside the package: text} for the members of a .deb that `keep(path)` accepts."""
    data = deb_path.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb_path}: not a Debian package (ar archive); download it with apt-get")
    pos = 8
    member = None
    while pos < len(data):
        name = data[pos : pos + 16].decode().strip().rstrip("/")
        size = int(data[pos + 48 : pos + 58].decode().strip())
        body = data[pos + 60 : pos + 60 + size]
        if name.startswith("data.tar"):
            member = body
            break
        pos += 60 + size + (size % 2)
    if member is None:
        raise ValueError(f"{deb_path}: no data.tar member found")
    out: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(member), mode="r:*") as tar:
        for info in tar:
            if info.isfile() and keep(info.name):
                fh = tar.extractfile(info)
                assert fh is not None  # isfile() checked above
                out[info.name] = fh.read().decode("utf-8", errors="replace")
    return dict(sorted(out.items()))


def read_sources(deb_path: Path) -> dict[str, str]:
    """The kept .rst.txt documentation sources, keyed by their path below _sources/."""

    def keep(name: str) -> bool:
        if not name.startswith(SOURCES_PREFIX) or not name.endswith(".rst.txt"):
            return False
        rel = name[len(SOURCES_PREFIX) :]
        return rel.startswith(KEEP_DIRS) or rel in KEEP_FILES

    return {name[len(SOURCES_PREFIX) :]: text for name, text in read_deb(deb_path, keep).items()}


def read_modules(deb_path: Path) -> dict[str, str]:
    """Standard-library modules (tests and the Tk IDE left out), keyed by dotted module name."""

    def keep(name: str) -> bool:
        parts = name.split("/")
        return (
            name.startswith(STDLIB_PREFIX)
            and name.endswith(".py")
            and not any(p in SKIP_PACKAGES for p in parts)
        )

    out = {}
    for name, text in read_deb(deb_path, keep).items():
        mod = name[len(STDLIB_PREFIX) : -3].replace("/", ".").removesuffix(".__init__")
        out[mod] = text
    return out


def split_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    cur: list[str] = []
    for raw in text.expandtabs(8).splitlines():
        if raw.strip():
            cur.append(raw.rstrip())
        elif cur:
            blocks.append(Block(len(cur[0]) - len(cur[0].lstrip()), cur))
            cur = []
    if cur:
        blocks.append(Block(len(cur[0]) - len(cur[0].lstrip()), cur))
    return blocks


def _is_rule(line: str) -> bool:
    s = line.strip()
    return len(s) >= 3 and len(set(s)) == 1 and s[0] in HEADING_CHARS


def heading_of(block: Block) -> str | None:
    """Return the title if the block is a section heading (underlined, optionally overlined)."""
    lines = [ln.strip() for ln in block.lines]
    if len(lines) == 2 and _is_rule(lines[1]) and not _is_rule(lines[0]):
        return lines[0]
    if len(lines) == 3 and _is_rule(lines[0]) and _is_rule(lines[2]):
        return lines[1]
    return None


_ROLE_WITH_TARGET = re.compile(r":[\w:.-]+:`([^`<]*?)\s*<[^`>]*>`")
_ROLE = re.compile(r":[\w:.-]+:`([^`]*)`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?")
_REF = re.compile(r"`([^`]+)`__?")
_LITERAL = re.compile(r"``([^`]+)``")
_STRONG = re.compile(r"\*\*([^*]+)\*\*")
_EMPH = re.compile(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])")
_SUBST = re.compile(r"\|([\w -]+)\|_?")
_FOOTNOTE = re.compile(r"\s*\[(#\w*|\d+|\*)\]_")
_SPACES = re.compile(r"\s+")


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1).strip()
    if text.startswith("!"):
        return text[1:]
    if text.startswith("~"):
        return text[1:].rsplit(".", 1)[-1]
    return text


def clean_inline(text: str) -> str:
    text = _ROLE_WITH_TARGET.sub(lambda m: m.group(1).strip(), text)
    text = _ROLE.sub(_role_text, text)
    text = _LITERAL.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _REF.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPH.sub(r"\1", text)
    text = _FOOTNOTE.sub("", text)
    text = _SUBST.sub(r"\1", text)
    text = text.replace("\\", "")
    return _SPACES.sub(" ", text).strip()


def is_prose(text: str) -> bool:
    """Keep sentences of words; drop code, tables and lists of identifiers."""
    words = text.split()
    if len(words) < 6 or not text[0].isalnum():
        return False
    letters = sum(ch.isalpha() or ch == " " for ch in text)
    if letters / len(text) < 0.85:
        return False
    plain = sum(w.strip(".,;:()'\"!?").isalpha() for w in words)
    return plain / len(words) >= 0.75 and text.rstrip()[-1] in ".:;,?!)"


def _strip_bullet(line: str) -> str:
    return re.sub(r"^(\*|-|\+|#\.|\d+\.|\(\d+\))\s+", "", line.strip())


def parse_sections(text: str) -> list[Section]:
    """Turn one reST file into sections of cleaned prose paragraphs."""
    sections = [Section(title="")]
    skip_deeper_than: int | None = None
    for block in split_blocks(text):
        if skip_deeper_than is not None:
            if block.indent > skip_deeper_than:
                continue
            skip_deeper_than = None
        first = block.lines[0].strip()
        title = heading_of(block)
        if title is not None:
            sections.append(Section(title=clean_inline(title)))
            continue
        if first.startswith(".. "):
            name = first[3:].split("::", 1)[0].strip()
            if "::" not in first or name in SKIP_BODY_DIRECTIVES or name.startswith("_"):
                skip_deeper_than = block.indent
            continue
        if first.startswith((">>>", "+--", "+==", "===", "$ ", "%", "|")) or _is_rule(first):
            continue
        if first.startswith(":") and not first.startswith(":term:"):
            continue  # field lists (:param x:, :class:...) and option lists
        literal_follows = block.lines[-1].rstrip().endswith("::")
        if literal_follows:
            skip_deeper_than = block.indent
        # A block may hold several bullet items; each becomes its own paragraph.
        items: list[list[str]] = []
        for line in block.lines:
            if re.match(r"^\s*(\*|-|\+|#\.|\d+\.)\s+", line) or not items:
                items.append([_strip_bullet(line)])
            else:
                items[-1].append(line.strip())
        for item in items:
            para = " ".join(item)
            if para.endswith("::"):
                continue  # it introduces a code sample that is dropped, so it would dangle
            para = clean_inline(para)
            if is_prose(para):
                sections[-1].paragraphs.append(para)
    return sections


def chat_title(title: str) -> str | None:
    """A heading fit to be asked about, e.g. 'json --- JSON encoder and decoder' -> 'JSON encoder and decoder'."""
    if "---" in title:
        title = title.split("---", 1)[1]
    title = title.strip().rstrip(".:")
    if len(title.split()) < 2 or len(title) > 80 or not title[0].isalpha():
        return None
    if title.lower().startswith(("what", "how", "why", "when", "can", "is ", "are ", "do ", "does ")):
        return None  # question-form headings (FAQ) are used verbatim below
    return title[0].lower() + title[1:] if title.split()[0].istitle() and not title.isupper() else title


def records_for(rel: str, text: str) -> list[dict]:
    out: list[dict] = []
    sections = parse_sections(text)
    doc = "\n\n".join(p for s in sections for p in s.paragraphs)
    if doc:
        out.append({"text": doc})
    for sec in sections:
        if not sec.paragraphs:
            continue
        answer = sec.paragraphs[0]
        if len(answer) < 300 and len(sec.paragraphs) > 1:
            answer += "\n\n" + sec.paragraphs[1]
        if sec.title.endswith("?"):
            question = sec.title
        else:
            topic = chat_title(sec.title)
            if topic is None:
                continue
            # Stable per-heading choice so the corpus is identical on every run.
            digest = hashlib.sha256(f"{rel}:{sec.title}".encode()).digest()
            question = CHAT_QUESTIONS[digest[0] % len(CHAT_QUESTIONS)].format(t=topic)
        out.append(
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": answer},
                ]
            }
        )
    return out


def docstring_paragraphs(doc: str) -> list[str]:
    paras = []
    for chunk in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        if ">>>" in chunk or chunk.startswith((" ", "\t")):
            continue  # doctest sessions and indented code
        para = clean_inline(" ".join(line.strip() for line in chunk.splitlines()))
        if is_prose(para):
            paras.append(para)
    return paras


def docstring_records(module: str, source: str) -> list[dict]:
    """One document per module (its docstrings in source order) and a chat per public function or class."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # a few modules hold Python 2 or template syntax on purpose
    out: list[dict] = []
    doc_paras: list[str] = []
    pending = [(tree, module)]
    while pending:
        node, qualname = pending.pop(0)
        doc = ast.get_docstring(node, clean=False)
        paras = docstring_paragraphs(doc) if doc else []
        doc_paras.extend(paras)
        public = not any(part.startswith("_") for part in qualname.split("."))
        if paras and node is not tree and public:
            answer = paras[0] if len(paras[0]) >= 200 or len(paras) == 1 else paras[0] + "\n\n" + paras[1]
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            question = f"What does the {kind} {qualname} do?"
            out.append(
                {
                    "messages": [
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                pending.append((child, f"{qualname}.{child.name}"))
    if doc_paras:
        out.insert(0, {"text": "\n\n".join(doc_paras)})
    return out


def write_words(records: list[dict], out_path: Path, min_count: int = 2) -> None:
    """The corpus vocabulary (lower-case words seen at least `min_count` times), one per line.

    Tests use it to check that the models continue prompts with words of the language they learnt.
    """
    counts: dict[str, int] = {}
    for rec in records:
        parts = [rec["text"]] if "text" in rec else [m["content"] for m in rec["messages"]]
        for part in parts:
            for word in re.findall(r"[a-z]+", part.lower()):
                counts[word] = counts.get(word, 0) + 1
    words = sorted(w for w, n in counts.items() if n >= min_count)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("\n".join(words) + "\n")


def build(
    deb_path: Path, stdlib_debs: list[Path], out_path: Path, words_out: Path | None = None
) -> dict[str, int]:
    sources = read_sources(deb_path)
    if not sources:
        raise ValueError(f"--deb {deb_path}: no documentation sources found under {SOURCES_PREFIX}")
    records = [rec for rel, text in sources.items() for rec in records_for(rel, text)]
    modules: dict[str, str] = {}
    for deb in stdlib_debs:
        modules.update(read_modules(deb))
    records += [rec for mod, src in sorted(modules.items()) for rec in docstring_records(mod, src)]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    payload = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
    with open(out_path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(payload.encode("utf-8"))
    if words_out is not None:
        write_words(records, words_out)
    n_text = sum("text" in r for r in records)
    return {
        "doc_files": len(sources),
        "modules": len(modules),
        "documents": n_text,
        "chats": len(records) - n_text,
        "chars": sum(len(r.get("text", "")) for r in records),
        "sha256": int(hashlib.sha256(payload.encode()).hexdigest()[:12], 16),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deb", type=Path, required=True, help=f"python3.11-doc_{DEB_VERSION}_all.deb")
    ap.add_argument(
        "--stdlib-deb",
        type=Path,
        action="append",
        default=[],
        help=f"libpython3.11-minimal / libpython3.11-stdlib {DEB_VERSION} .deb (docstrings); repeatable",
    )
    ap.add_argument("--out", type=Path, default=Path(".train/corpus.jsonl.gz"))
    ap.add_argument("--words-out", type=Path, default=None, help="also write the corpus vocabulary here")
    args = ap.parse_args()
    stats = build(args.deb, args.stdlib_deb, args.out, args.words_out)
    stats["sha256"] = f"{stats['sha256']:012x}"
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
