#!/usr/bin/env python3
"""Build the training corpus of the bundled model from freely licensed Debian packages.

    python tools/build_corpus.py --out data/corpus

Fetches the packages with `apt-get download` (Debian's ordinary client; run `apt-get update` once
first), unpacks them with `dpkg-deb -x`, cleans them into plain-text documents and writes

    data/corpus/train.jsonl, data/corpus/heldout.jsonl   one {"src": ..., "text": ...} per line
    data/corpus/manifest.json                            packages, versions, licenses, sizes

The held-out split is chosen per document by a hash of its source and index (about 2%), so it is
stable across runs. Nothing here is committed: /data/ is gitignored.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import json
import re
import subprocess
import zlib
from pathlib import Path

# package -> (license as stated in its debian/copyright, what we take)
PACKAGES = {
    "dict-gcide": ("GPL-2.0-or-later (GCIDE: Webster's 1913 + WordNet, GNU version)",
                   "dictionary definitions"),
    "python3.11-doc": ("PSF-2.0 (Python documentation; some parts under other permissive licenses "
                       "listed in its copyright file)", "reStructuredText sources of the docs"),
    "fortunes-zh": ("GPL-3.0-or-later", "Chinese Tang/Song poems and sayings"),
    "jargon-text": ("Public domain (the Jargon File 4.4.7; packaging GPL)", "the Jargon File"),
}

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def sh(*cmd: str, cwd: Path | None = None) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def fetch(pkgdir: Path) -> dict[str, dict]:
    debs = pkgdir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    info = {}
    for pkg, (lic, what) in PACKAGES.items():
        have = list(debs.glob(f"{pkg}_*.deb"))
        if not have:
            sh("apt-get", "download", pkg, cwd=debs)
            have = list(debs.glob(f"{pkg}_*.deb"))
        deb = sorted(have)[-1]
        root = pkgdir / "pkgs" / pkg
        if not root.exists():
            root.mkdir(parents=True)
            sh("dpkg-deb", "-x", str(deb), str(root))
        version = sh("dpkg-deb", "-f", str(deb), "Version").strip()
        info[pkg] = {"deb": deb.name, "version": version, "license": lic, "content": what,
                     "sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
                     "copyright_file": f"/usr/share/doc/{pkg}/copyright"}
    return info


def _chunks(parts: list[str], target: int, sep: str) -> list[str]:
    """Join consecutive parts into documents of about `target` characters."""
    out, cur, n = [], [], 0
    for p in parts:
        cur.append(p)
        n += len(p)
        if n >= target:
            out.append(sep.join(cur))
            cur, n = [], 0
    if cur:
        out.append(sep.join(cur))
    return out


def gcide_docs(root: Path) -> list[str]:
    d = root / "usr/share/dictd"
    raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress((d / "gcide.dict.dz").read_bytes())
    # The index gives (headword, base64 offset, base64 length) per entry.
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def dec(s: str) -> int:
        v = 0
        for ch in s:
            v = v * 64 + b64.index(ch)
        return v

    spans = set()
    for line in (d / "gcide.index").read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or parts[0].startswith("00-database"):
            continue
        spans.add((dec(parts[1]), dec(parts[2])))
    # dictd offsets are byte offsets: slice the raw bytes.
    rawb = raw
    entries = []
    for off, ln in sorted(spans):
        t = rawb[off:off + ln].decode("utf-8", errors="replace").strip()
        t = re.sub(r"[ \t]+\n", "\n", t)
        if t and not t.startswith("00") and "GNU General Public License" not in t:
            entries.append(t)
    return _chunks(entries, 6000, "\n\n")


RST_DROP = re.compile(r"^\.\. (index|highlight|sectionauthor|moduleauthor|testsetup|testcleanup|"
                      r"_[^:]+|include|toctree|only|versionchanged|versionadded|deprecated|seealso)::?.*$")


def rst_clean(t: str) -> str:
    out = []
    skip_indent = False
    for line in t.splitlines():
        if RST_DROP.match(line):
            skip_indent = line.startswith(".. toctree") or line.startswith(".. index")
            continue
        if skip_indent:
            if line.startswith(" ") or not line.strip():
                continue
            skip_indent = False
        # roles like :func:`open` -> open ; :ref:`text <label>` -> text
        line = re.sub(r":[a-zA-Z:]+:`~?([^`<]*?)\s*(<[^`]*>)?`", r"\1", line)
        line = re.sub(r"``([^`]*)``", r"\1", line)
        out.append(line.rstrip())
    t = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", t).strip()


def pydoc_docs(root: Path) -> list[str]:
    src = root / "usr/share/doc/python3.11/html/_sources"
    docs = []
    for f in sorted(src.rglob("*.rst.txt")):
        rel = str(f.relative_to(src))
        if rel.startswith(("whatsnew/changelog", "license")):
            continue  # the changelog is a long list of issue numbers; license is legal text
        t = rst_clean(f.read_text(encoding="utf-8", errors="replace"))
        if len(t) < 200:
            continue
        # very long pages are split at section boundaries into ~20k-char documents
        docs.extend(_chunks(re.split(r"\n(?=\S[^\n]*\n[=\-~^*#]{3,}\n)", t), 20000, "\n"))
    return docs


def fortunes_zh_docs(root: Path) -> list[str]:
    docs = []
    for name in ("tang300", "song100", "chinese"):
        t = ANSI.sub("", (root / "usr/share/games/fortunes" / name).read_text(encoding="utf-8", errors="replace"))
        items = [x.strip() for x in t.split("\n%\n") if x.strip()]
        docs.extend(_chunks(items, 3000, "\n\n"))
    return docs


def jargon_docs(root: Path) -> list[str]:
    t = gzip.decompress((root / "usr/share/doc/jargon-text/jargon.txt.gz").read_bytes()).decode("utf-8", "replace")
    t = html.unescape(t)
    # Paragraphs (entries are indented "   :headword: ..." blocks); the long headword index is dropped.
    parts = [p.strip("\n") for p in re.split(r"\n\s*\n", t)]
    parts = [p for p in parts if len(p.strip()) > 40]
    return _chunks(parts, 6000, "\n\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="data", help="where .deb files and unpacked packages go")
    ap.add_argument("--out", default="data/corpus")
    ap.add_argument("--heldout-permille", type=int, default=20)
    args = ap.parse_args()
    work, out = Path(args.workdir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = fetch(work)
    builders = {"dict-gcide": gcide_docs, "python3.11-doc": pydoc_docs,
                "fortunes-zh": fortunes_zh_docs, "jargon-text": jargon_docs}
    stats = {}
    with open(out / "train.jsonl", "w", encoding="utf-8") as ftr, open(out / "heldout.jsonl", "w", encoding="utf-8") as fho:
        for pkg, fn in builders.items():
            docs = fn(work / "pkgs" / pkg)
            s = {"docs": 0, "chars": 0, "bytes": 0, "heldout_docs": 0, "heldout_bytes": 0}
            for i, text in enumerate(docs):
                h = int(hashlib.sha1(f"{pkg}:{i}".encode()).hexdigest(), 16) % 1000
                held = h < args.heldout_permille
                (fho if held else ftr).write(json.dumps({"src": pkg, "text": text}, ensure_ascii=False) + "\n")
                nb = len(text.encode("utf-8"))
                s["docs"] += 1
                s["chars"] += len(text)
                s["bytes"] += nb
                if held:
                    s["heldout_docs"] += 1
                    s["heldout_bytes"] += nb
            stats[pkg] = s
            print(pkg, s, flush=True)
    manifest = {"packages": info, "stats": stats,
                "heldout": f"documents whose sha1('pkg:index') % 1000 < {args.heldout_permille}"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    print("wrote", out)


if __name__ == "__main__":
    main()
