"""The docs site (mkdocs.yml, ``make docs``): the real build of docs/ passes strictly, and the strictness is
real: a link to a missing page, heading or repository file fails it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from mkdocs.structure.files import File, Files

from tests.support import docs_hooks

REPO = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    started = time.monotonic()
    built = _build(REPO / "mkdocs.yml", tmp_path / "site")
    seconds = time.monotonic() - started
    assert built.returncode == 0, f"make docs fails:\n{built.stderr}"
    print(f"docs site built strictly in {seconds:.1f}s")
    for page in ("config", "metrics", "cli", "alerts"):
        assert (tmp_path / "site" / "reference" / page / "index.html").is_file(), page


def test_a_broken_link_anchor_or_repository_file_fails_the_build(tmp_path: Path) -> None:
    """A site of its own with each kind of broken link, on the real mkdocs.yml and hooks."""
    (tmp_path / "docs" / "how-to").mkdir(parents=True)
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "README.md").write_text("# E2E\n\n## Timings\n")
    (tmp_path / "mkdocs.yml").write_text(
        f"INHERIT: {REPO / 'mkdocs.yml'}\nhooks:\n  - {REPO / 'tests' / 'support' / 'docs_hooks.py'}\n"
    )
    (tmp_path / "docs" / "index.md").write_text(
        "# Home\n\n[fine](how-to/a.md#section-one), [fine](../tests/e2e/README.md#timings), `[code](x.md)`.\n\n"
        "[bad anchor](how-to/a.md#no-such-section) [bad page](how-to/missing.md)\n"
    )
    (tmp_path / "docs" / "how-to" / "a.md").write_text(
        "# A\n\n## Section one\n\n[bad heading](../../tests/e2e/README.md#no-such-heading) "
        "[bad file](../../tests/gone/README.md)\n"
    )
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    for expected in (
        "contains a link 'how-to/a.md#no-such-section', but the doc 'how-to/a.md' does not contain an anchor",
        "contains a link 'how-to/missing.md', but the target is not found among documentation files",
        "docs/how-to/a.md:5 links to ../../tests/e2e/README.md#no-such-heading, but README.md has no heading "
        "with the id 'no-such-heading'",
        "docs/how-to/a.md:5 links to ../../tests/gone/README.md, which is not a file of the repository",
    ):
        assert expected in built.stderr, built.stderr
    warnings = [line for line in built.stderr.splitlines() if line.startswith("WARNING")]
    fine = ("#section-one", "README.md#timings", "'x.md'", " x.md")
    assert not [w for w in warnings if any(link in w for link in fine)], warnings


def test_the_navigation_follows_the_folders_in_reading_order() -> None:
    names = [
        "evidence/bench.md",
        "reference/config.md",
        "index.md",
        "explanation/architecture.md",
        "how-to/troubleshooting.md",
        "tutorials/kapsule.md",
        "tutorials/bizfly.md",
        "reference/index.md",
        "misc/notes.md",
    ]
    files = Files([File(name, "docs", "site", use_directory_urls=True) for name in names])
    config = {"nav": None}
    docs_hooks.on_files(files, config)
    sections = [next(iter(item)) if isinstance(item, dict) else item for item in config["nav"]]
    assert sections == ["index.md", "Tutorials", "How to", "Reference", "Explanation", "Evidence", "Misc"]
    reference = next(item["Reference"] for item in config["nav"] if isinstance(item, dict) and "Reference" in item)
    assert reference == ["reference/index.md", "reference/config.md"]  # the section's index first


def test_a_link_out_of_docs_points_at_the_repository_when_it_has_an_address(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "values.yaml").write_text("a: 1\n")
    page = SimpleNamespace(file=SimpleNamespace(src_uri="index.md"))
    config = {"docs_dir": str(tmp_path / "docs"), "config_file_path": str(tmp_path / "mkdocs.yml"), "repo_url": ""}
    text = "See [the values](../deploy/values.yaml) and [a page](other.md)."
    assert docs_hooks.on_page_markdown(text, page, config, Files([])) == (
        "See the values (`deploy/values.yaml`) and [a page](other.md)."
    )
    config["repo_url"] = "https://example.org/ca-externalgrpc/"
    assert docs_hooks.on_page_markdown(text, page, config, Files([])) == (
        "See [the values](https://example.org/ca-externalgrpc/blob/HEAD/deploy/values.yaml) and [a page](other.md)."
    )
