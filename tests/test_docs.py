"""The documentation holds together without MkDocs installed: generated pages match the registries, every relative
link and anchor in README.md and docs/ resolves, the site's nav names real pages, and the README stays a front page."""
from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest
import yaml

from sim.paths import REPO_ROOT

DOCS = REPO_ROOT / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_tables", DOCS / "gen_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("rel", ["reference/policies.md", "reference/glossary.md"])
def test_generated_pages_match_the_registries(rel):
    gen = _gen()
    assert (DOCS / rel).read_text(encoding="utf-8") == gen.PAGES[rel](), \
        f"docs/{rel} is stale: run `make docs` (or python docs/gen_tables.py) and commit it"


def test_policy_page_has_one_row_per_registered_policy():
    gen = _gen()
    names = set(gen.builtin_policies())
    text = (DOCS / "reference" / "policies.md").read_text()
    table = text.split("## Knobs of each family")[0]
    rows = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    assert len(rows) == len(set(rows)) and set(rows) == names
    from policies import POLICIES
    assert names == {n for n, (cls, _, _) in POLICIES.items() if cls.__module__.startswith("policies.")}


def _strip_code(text: str) -> str:
    """Markdown without fenced blocks and inline code, where link-like text is not a link."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """MkDocs' default anchor for a heading (Python-Markdown's toc slugify over the heading's text)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)}


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(path: Path):
    for target in LINK.findall(_strip_code(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):          # http:, https:, mailto:
            continue
        yield target


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in pages():
        for target in links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(REPO_ROOT)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
                continue
            if page.is_relative_to(DOCS) and not dest.is_relative_to(DOCS):
                broken.append(f"{where} (leaves docs/: the site cannot serve it; name the file in code instead)")
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_the_link_checker_finds_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A `code` heading: here\n\n[ok](#a-code-heading-here) [bad](#nope) `[not](a-link.md)`\n")
    assert slug("A `code` heading: here") in anchors(page)
    assert list(links(page)) == ["#a-code-heading-here", "#nope"]


def test_site_nav_names_existing_pages_and_every_page_is_in_it():
    cfg = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())
    named = []

    def walk(node):
        if isinstance(node, str):
            named.append(node)
        elif isinstance(node, list):
            for x in node:
                walk(x)
        elif isinstance(node, dict):
            for x in node.values():
                walk(x)
    walk(cfg["nav"])
    assert all((DOCS / p).is_file() for p in named), [p for p in named if not (DOCS / p).is_file()]
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk == set(named), on_disk ^ set(named)
    assert cfg["strict"] is True and cfg["theme"]["name"] == "material"


def test_readme_is_a_front_page():
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for must in ("make demo", "make test", "make docs", "docs/guide/getting-started.md"):
        assert must in text
