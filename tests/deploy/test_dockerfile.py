"""deploy/Dockerfile, linted structurally: multi-stage with the wheel built in the builder, nothing
built in the final stage, a numeric non-root user, and an exec-form ENTRYPOINT that is the installed
console script. No container engine is needed for these checks."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.rendering import DEPLOY, REPO, container, one, render

DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    argument: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (as the builders do)."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            keyword, _, argument = full.partition(" ")
            instructions.append(Instruction(keyword.upper(), argument.strip()))
    assert not pending, "the Dockerfile ends with a continuation line"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def _exec_form(ins: Instruction) -> list[str]:
    value = json.loads(ins.argument)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"{ins.keyword} is not exec form"
    return value


def test_build_is_multi_stage_with_the_wheel_built_in_a_named_builder(instructions: list[Instruction]) -> None:
    all_stages = stages(instructions)
    assert len(all_stages) >= 2
    builder, final = all_stages[0], all_stages[-1]
    assert re.search(r"\bAS\s+builder$", builder[0].argument, re.IGNORECASE)
    builder_runs = " ".join(i.argument for i in builder if i.keyword == "RUN")
    assert "pip wheel" in builder_runs
    copies = [i.argument for i in final if i.keyword == "COPY"]
    assert any(c.startswith("--from=builder ") for c in copies)


def test_final_stage_builds_and_installs_nothing(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    runs = " ".join(i.argument for i in final if i.keyword == "RUN")
    for tool in ("apt-get install", "apk add", "pip install", "pip wheel", "gcc", "build-essential", "make "):
        assert tool not in runs, f"the final stage runs {tool!r}"
    assert not any(i.keyword == "ADD" for i in final), "ADD can fetch URLs and unpack archives; use COPY"


def test_both_stages_use_the_same_slim_python_311_base(instructions: list[Instruction]) -> None:
    args = {i.argument.split("=", 1)[0]: i.argument.split("=", 1)[1] for i in instructions if i.keyword == "ARG"}
    bases = [s[0].argument.split()[0] for s in stages(instructions)]
    assert len(set(bases)) == 1, "the virtualenv is copied between stages: the interpreter must be the same"
    base = bases[0]
    if base.startswith("${") and base.endswith("}"):
        base = args[base[2:-1]]
    assert re.match(r"^python:3\.11(\.\d+)?-slim", base), base


def test_runs_as_a_numeric_non_root_user(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    users = [i.argument for i in final if i.keyword == "USER"]
    assert users, "no USER in the final stage: the container would run as root"
    uid, _, gid = users[-1].partition(":")
    # Numeric, so the kubelet can enforce runAsNonRoot without looking the name up.
    assert uid.isdigit() and int(uid) > 0
    assert not gid or (gid.isdigit() and int(gid) > 0)
    # Nothing after USER may switch back to root.
    last_user = max(i for i, ins in enumerate(final) if ins.keyword == "USER")
    assert not any(ins.keyword == "RUN" for ins in final[last_user:])


def test_entrypoint_is_the_installed_console_script_in_exec_form(instructions: list[Instruction]) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = _exec_form([i for i in instructions if i.keyword == "ENTRYPOINT"][-1])
    assert len(entrypoint) == 1
    assert Path(entrypoint[0]).name in scripts
    # The builder installs into the same prefix the ENTRYPOINT points at.
    prefix = str(Path(entrypoint[0]).parent.parent)
    assert any(prefix in i.argument for i in instructions if i.keyword == "RUN")


def test_default_command_serves_the_config_path_the_manifests_mount(instructions: list[Instruction]) -> None:
    command = _exec_form([i for i in instructions if i.keyword == "CMD"][-1])
    assert command[:2] == ["serve", "--config"]
    ctr = container(one(render("overlays/scaleway"), "Deployment", "cluster-autoscaler"), "ca-externalgrpc")
    assert f"--config={command[2]}" in ctr["args"]


def test_read_only_root_filesystem_is_supported(instructions: list[Instruction]) -> None:
    env = " ".join(i.argument for i in stages(instructions)[-1] if i.keyword == "ENV")
    assert re.search(r"\bPYTHONDONTWRITEBYTECODE=1\b", env)
    # Byte-code is compiled at build time since the running container cannot write it.
    assert any("compileall" in i.argument for i in instructions if i.keyword == "RUN")
    assert re.search(r"\bHOME=/tmp\b", env), "HOME must point at the writable /tmp volume"


def test_build_context_excludes_everything_but_the_package_sources(instructions: list[Instruction]) -> None:
    lines = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "**", ".dockerignore must start by excluding everything (allow-list)"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = set()
    for ins in instructions:
        if ins.keyword == "COPY" and not ins.argument.startswith("--from="):
            *sources, _ = ins.argument.split()
            copied |= {s.rstrip("/") for s in sources}
    assert copied <= allowed, f"COPY of paths the context does not contain: {sorted(copied - allowed)}"
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in packages["include"]} <= copied
    assert not {".venv", "tests", ".git"} & allowed


def test_parser_joins_continuations_and_drops_comments() -> None:
    parsed = parse_dockerfile("FROM a AS b\n# note\nRUN one \\\n  # inner\n  two\nUSER 1\n")
    assert parsed == [Instruction("FROM", "a AS b"), Instruction("RUN", "one two"), Instruction("USER", "1")]
