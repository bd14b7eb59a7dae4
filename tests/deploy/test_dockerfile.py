"""deploy/Dockerfile, linted structurally: multi-stage with the wheel built in the builder, the native
serving engine's wheel either built from native/Cargo.lock in a Rust stage or taken from the build
context (make wheels), installed next to it from local wheels, nothing built in the final stage, a
numeric non-root user, and an exec-form ENTRYPOINT that is the installed console script. No container
engine is needed for these checks; tests/install builds nothing either but runs what make image built."""

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


def stage_named(instructions: list[Instruction], name: str) -> list[Instruction]:
    named = [s for s in stages(instructions) if re.search(rf"\bAS\s+{name}$", s[0].argument, re.IGNORECASE)]
    assert len(named) == 1, f"no stage named {name!r} (FROM ... AS {name})"
    return named[0]


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    return {
        i.argument.split("=", 1)[0]: i.argument.split("=", 1)[1].strip('"')
        for i in instructions
        if i.keyword == "ARG" and "=" in i.argument
    }


def base_image(instructions: list[Instruction], stage: list[Instruction]) -> str:
    """The stage's FROM image with a ${ARG} reference replaced by the ARG's default."""
    base = stage[0].argument.split()[0]
    if base.startswith("${") and base.endswith("}"):
        base = arg_defaults(instructions)[base[2:-1]]
    return base


def runs(stage: list[Instruction]) -> str:
    return " ".join(i.argument for i in stage if i.keyword == "RUN")


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
    builder, final = stage_named(instructions, "builder"), all_stages[-1]
    assert builder is not final
    assert "pip wheel" in runs(builder)
    copies = [i.argument for i in final if i.keyword == "COPY"]
    assert any(c.startswith("--from=builder ") for c in copies)


def test_final_stage_builds_and_installs_nothing(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    final_runs = runs(final)
    for tool in ("apt-get install", "apk add", "pip install", "pip wheel", "gcc", "build-essential", "make "):
        assert tool not in final_runs, f"the final stage runs {tool!r}"
    assert not any(i.keyword == "ADD" for i in final), "ADD can fetch URLs and unpack archives; use COPY"


def test_final_stage_gets_no_rust_toolchain(instructions: list[Instruction]) -> None:
    """The Rust stage's toolchain (rustc, cargo, gcc, maturin, the crates) stays in that stage: the final
    stage starts from the Python base and copies only the builder's virtualenv."""
    final = stages(instructions)[-1]
    assert not base_image(instructions, final).startswith("rust:"), "the final stage is built on the Rust image"
    copies = [i.argument for i in final if i.keyword == "COPY"]
    assert copies and all(c.startswith(("--from=builder ", "--from=sbom ")) for c in copies), copies
    assert not re.search(r"\b(cargo|rustc|rustup|maturin)\b", runs(final))
    # Nor does the builder, whose virtualenv the final stage copies, install maturin or Rust into it.
    builder = stage_named(instructions, "builder")
    assert not base_image(instructions, builder).startswith("rust:")
    assert not re.search(r"\b(cargo|rustc|rustup|maturin)\b", runs(builder))


def test_builder_and_runtime_default_to_the_same_slim_python_311_base(instructions: list[Instruction]) -> None:
    """The virtualenv is copied between stages: the runtime must hold the builder's interpreter. Both
    bases are build arguments (make image passes a Debian-made pair); their defaults are one image."""
    builder, final = stage_named(instructions, "builder"), stages(instructions)[-1]
    assert final == stage_named(instructions, "runtime")
    defaults = {base_image(instructions, builder), base_image(instructions, final)}
    assert len(defaults) == 1, defaults
    assert re.match(r"^python:3\.11(\.\d+)?-slim", base_image(instructions, final)), base_image(instructions, final)
    for stage in (builder, final):
        assert stage[0].argument.split()[0].startswith("${"), "the base is a build argument"


def test_the_native_wheel_comes_from_the_stage_native_wheel_names_by_default_the_rust_one(
    instructions: list[Instruction],
) -> None:
    native = stage_named(instructions, "native")
    assert native[0].argument.split()[0] == "native-${NATIVE_WHEEL}" and len(native) == 1
    assert arg_defaults(instructions)["NATIVE_WHEEL"] == "rust"
    for choice in ("rust", "context"):  # the two values docs/reference/image.md and make image use
        stage_named(instructions, f"native-{choice}")


def test_native_context_stage_takes_only_the_wheel_make_wheels_builds(instructions: list[Instruction]) -> None:
    stage = stage_named(instructions, "native-context")
    assert stage[0].argument.split()[0] == "scratch"
    (copy,) = [i.argument.split() for i in stage if i.keyword == "COPY"]
    assert copy == ["dist/ca_externalgrpc_native-*.whl", "/wheels/"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"maturin build --release --locked .*--out dist", makefile), "make wheels writes elsewhere"


def test_native_engine_is_built_by_maturin_in_a_rust_stage_from_the_lock_file(
    instructions: list[Instruction],
) -> None:
    native = stage_named(instructions, "native-rust")
    rust = base_image(instructions, native)
    # A pinned minor (not rust:slim or rust:1-slim) on a named Debian release: the same toolchain and
    # glibc every build.
    assert re.match(r"^rust:\d+\.\d+(\.\d+)?-slim-[a-z]+$", rust), rust
    native_runs = [i.argument for i in native if i.keyword == "RUN"]
    builds = [r for r in native_runs if "maturin build" in r]
    assert builds, "the native stage does not run maturin build"
    for build in builds:
        assert "--release" in build and "--locked" in build, build
    # Every cargo invocation (fetch, build) sticks to native/Cargo.lock, the crates CI builds.
    for cargo in re.findall(r"\bcargo \w+[^&;]*", " ".join(native_runs)):
        assert "--locked" in cargo or "--frozen" in cargo, cargo
    sources = [s for i in native if i.keyword == "COPY" for s in i.argument.split()[:-1]]
    assert "native/Cargo.lock" in sources and "native/src" in sources
    # The manifest and the lock file come before the sources, so a source change reuses the crates.
    assert sources.index("native/Cargo.lock") < sources.index("native/src")


def test_every_python_package_the_build_installs_is_a_file_of_the_lock_with_its_hash_checked(
    instructions: list[Instruction],
) -> None:
    """Tools (maturin, setuptools, the SBOM's) and the server's dependencies alike: pip downloads them
    only as the exact files of requirements/*.txt (--require-hashes, binary wheels only), and installs
    only from local files (--no-index). No package is named with a version of its own in the Dockerfile."""
    text = runs([i for i in instructions if i.keyword == "RUN"])
    downloads = re.findall(r"pip download [^&;]*", text)
    assert downloads
    for download in downloads:
        assert "--require-hashes" in download and "--only-binary=:all:" in download, download
        assert re.search(r"-r (/?requirements/\w+\.txt|/requirements/\w+\.txt)", download), download
    for install in re.findall(r"pip (?:--python \S+ )?install [^&;]*", text):
        assert "--no-index" in install, install
        if "-r " in install:
            assert "--require-hashes" in install, install
    assert not re.search(r"pip (?:install|download) [^&;]*\b[\w-]+==", text)
    # maturin comes from the lock's build group, where make install's maturin comes from too.
    group = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]["build"]
    assert any(re.match(r"^maturin\b", d) for d in group)
    assert "requirements/build.txt" in runs(stage_named(instructions, "native-rust"))


def test_a_lock_behind_pyproject_stops_the_build_with_one_line_saying_run_make_lock(
    instructions: list[Instruction],
) -> None:
    builder = runs(stage_named(instructions, "builder"))
    check = re.search(r"pip --python /opt/ca-externalgrpc/bin/python check .*?\}; \}", builder)
    assert check, "the builder does not run pip check on the server's virtualenv"
    assert "run make lock" in check.group(0) and check.group(0).count("echo ") == 1


def test_the_image_is_labelled_with_its_version_revision_and_source(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    label = " ".join(i.argument for i in final if i.keyword == "LABEL")
    for key, arg in (("version", "VERSION"), ("revision", "REVISION"), ("source", "SOURCE")):
        assert f'org.opencontainers.image.{key}="${{{arg}}}"' in label, key
        assert any(i.keyword == "ARG" and i.argument == arg for i in final), f"ARG {arg} is not in the final stage"
        assert arg_defaults(instructions)[arg] == "unknown"


def test_the_image_carries_its_bill_of_materials_from_the_sbom_stage(instructions: list[Instruction]) -> None:
    from tests.support.imagebuild import SBOM_IN_IMAGE

    final = stages(instructions)[-1]
    assert any(i.keyword == "COPY" and i.argument.endswith(f" {SBOM_IN_IMAGE}") for i in final)
    sbom = runs(stage_named(instructions, "sbom"))
    assert "cyclonedx-py environment" in sbom and "deploy/sbom.py" in sbom and "--dpkg-status" in sbom


def test_rust_image_is_the_python_images_debian_release(instructions: list[Instruction]) -> None:
    """The extension links against the Rust image's glibc: it must not be newer than the runtime's."""
    rust = base_image(instructions, stage_named(instructions, "native-rust"))
    python = base_image(instructions, stages(instructions)[-1])
    release = rust.rsplit("-", 1)[-1]
    assert python.endswith(f"-{release}"), f"{rust} and {python} are not the same Debian release"


def test_rust_image_is_the_toolchain_contributing_names(instructions: list[Instruction]) -> None:
    rust = base_image(instructions, stage_named(instructions, "native-rust"))
    named = re.search(r"built and tested with (\d+\.\d+)", (REPO / "CONTRIBUTING.md").read_text())
    assert named, "CONTRIBUTING.md no longer says which Rust the native engine is built and tested with"
    assert rust.startswith(f"rust:{named.group(1)}"), (rust, named.group(0))


def test_builder_installs_the_native_wheel_from_local_wheels_and_imports_it(
    instructions: list[Instruction],
) -> None:
    builder = stage_named(instructions, "builder")
    assert any(i.keyword == "COPY" and i.argument.startswith("--from=native ") for i in builder)
    installs = [r for r in (i.argument for i in builder if i.keyword == "RUN") if "pip" in r and " install " in r]
    assert installs, "the builder installs nothing"
    for install in installs:
        assert "--no-index" in install, f"pip may fetch from an index: {install}"
    # Through the server's [native] extra, which names the native engine's distribution.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [re.split(r"[=<>~ ]", d)[0] for d in extras["native"]] == ["ca-externalgrpc-native"]
    assert any('"ca-externalgrpc-server[native]"' in r for r in installs), "the native engine's wheel is not installed"
    # The smoke test: the extension imports with the virtualenv's interpreter.
    assert re.search(r"/opt/ca-externalgrpc/bin/python -c \"import ca_externalgrpc_native[,\"]", runs(builder))


def test_runtime_stage_checks_that_its_base_runs_what_the_builder_installed(instructions: list[Instruction]) -> None:
    """A runtime base that lacks a library an extension links (make image cuts its own) fails the build."""
    final = stages(instructions)[-1]
    checks = [_exec_form(i) for i in final if i.keyword == "RUN" and i.argument.startswith("[")]
    assert checks, "no exec-form RUN check in the runtime stage"
    python, flag, code = checks[-1]
    assert (python, flag) == ("/opt/ca-externalgrpc/bin/python", "-c")
    for module in ("ca_externalgrpc_native", "grpc", "pydantic_core", "kubernetes.client"):
        assert module in code, module
    assert "cert_store_stats" in code, "the trust store the cloud calls verify against is not checked"


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
    outside = {c for c in copied if not any(c == a or c.startswith(f"{a}/") for a in allowed)}
    assert not outside, f"COPY of paths the context does not contain: {sorted(outside)}"
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in packages["include"]} <= copied
    assert not {".venv", "tests", ".git", "native", "native/target", "dist"} & allowed
    # From dist/ only the native wheel the native-context stage copies.
    assert {a for a in allowed if a.startswith("dist/")} == {"dist/ca_externalgrpc_native-*.whl"}


def test_parser_joins_continuations_and_drops_comments() -> None:
    parsed = parse_dockerfile("FROM a AS b\n# note\nRUN one \\\n  # inner\n  two\nUSER 1\n")
    assert parsed == [Instruction("FROM", "a AS b"), Instruction("RUN", "one two"), Instruction("USER", "1")]
