"""Pure logic of the Go build step (tests/support/gobuild.py): manifests, stamps, errors, environment.

Nothing here runs the Go compiler: ``go version`` is replaced by a fixed string, and the modules are
small trees written into a temporary repository.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import gobuild

GO_VERSION = "go version go1.26.8 linux/amd64"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository with a client module that replaces a module of its own repository locally, and a bench module."""
    root = tmp_path / "repo"
    monkeypatch.setattr(gobuild, "REPO", root)
    write(root / "tests/local/go.mod", "module example/local\n")
    write(root / "tests/local/local.go", "package local\n")
    write(
        root / "tests/client/go.mod",
        "module example/client\n\nrequire k8s.io/autoscaler/cluster-autoscaler v0.0.0-20260722070747-35e8a280425c\n"
        "\nreplace example/local => ../local\n",
    )
    write(root / "tests/client/main.go", "package main\n")
    write(root / "tests/client/nested/go.mod", "module example/nested\n")  # another module: not a source
    write(root / "tests/client/nested/nested.go", "package nested\n")
    write(
        root / "tests/client/build.toml",
        '[[binary]]\nname = "client"\npackage = "."\ntags = ["x"]\ngroups = ["conformance"]\n',
    )
    write(root / "deploy/tool/go.mod", "module example/tool\n")
    write(
        root / "deploy/tool/build.toml",
        '[[binary]]\nname = "tool-a"\npackage = "."\ngroups = ["bench"]\n\n'
        '[[binary]]\nname = "tool-b"\npackage = "./b"\ngroups = ["bench", "e2e"]\n',
    )
    return root


@pytest.fixture
def go_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gobuild, "go_binary", lambda: "/usr/bin/go")
    monkeypatch.setattr(gobuild, "go_version", lambda _go: GO_VERSION)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "bin"


# ---------------------------------------------------------------- manifests
def test_discovers_every_manifest_under_tests_and_deploy(repo: Path) -> None:
    binaries = {b.name: b for b in gobuild.discover(repo)}
    assert sorted(binaries) == ["client", "tool-a", "tool-b"]
    assert binaries["client"].tags == ("x",) and binaries["client"].module_dir == repo / "tests/client"
    assert binaries["tool-b"].package == "./b" and binaries["tool-b"].groups == ("bench", "e2e")


def test_select_by_group_and_name(repo: Path) -> None:
    binaries = gobuild.discover(repo)
    assert [b.name for b in gobuild.select(binaries, ["e2e"])] == ["tool-b"]
    assert [b.name for b in gobuild.select(binaries, ["conformance"], ["tool-a"])] == ["client", "tool-a"]
    assert len(gobuild.select(binaries)) == 3
    with pytest.raises(gobuild.BuildManifestError, match=r"unknown group\(s\) \['benhc'\]"):
        gobuild.select(binaries, ["benhc"])


def test_a_binary_declared_default_false_is_built_only_when_asked_for(repo: Path) -> None:
    # make build (no group: make test, .ci/run) leaves it out; its group or its name brings it in.
    write(repo / "tests/matrix/go.mod", "module example/matrix\n")
    write(
        repo / "tests/matrix/build.toml",
        '[[binary]]\nname = "old-ca"\npackage = "."\ngroups = ["matrix", "e2e"]\ndefault = false\n',
    )
    binaries = gobuild.discover(repo)
    assert [b.name for b in gobuild.select(binaries)] == ["client", "tool-a", "tool-b"]
    assert [b.name for b in gobuild.select(binaries, ["matrix"])] == ["old-ca"]
    assert [b.name for b in gobuild.select(binaries, ["e2e"])] == ["old-ca", "tool-b"]
    assert [b.name for b in gobuild.select(binaries, names=["old-ca"])] == ["old-ca"]


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ('[[binary]]\npackage = "."\ngroups = ["e2e"]\n', "needs a file name"),
        ('[[binary]]\nname = "a"\ngroups = ["e2e"]\n', "needs a package"),
        ('[[binary]]\nname = "a"\npackage = "."\n', "needs groups"),
        ('[[binary]]\nname = "a"\npackage = "."\ngroups = ["e2e"]\ntag = ["x"]\n', r"unknown key\(s\) \['tag'\]"),
        ('[[binary]]\nname = "a"\npackage = "."\ngroups = ["e2e"]\nldflags = "-s"\n', "ldflags must be a list"),
        ('[[binary]]\nname = "a"\npackage = "."\ngroups = ["e2e"]\ndefault = "no"\n', "default must be true or false"),
        ('name = "a"\n', r"declares no \[\[binary\]\]"),
        ("[[binary]\n", "not valid TOML"),
    ],
)
def test_a_wrong_manifest_is_named_with_what_is_wrong(tmp_path: Path, manifest: str, message: str) -> None:
    write(tmp_path / "tests/m/go.mod", "module m\n")
    write(tmp_path / "tests/m/build.toml", manifest)
    with pytest.raises(gobuild.BuildManifestError, match=message) as raised:
        gobuild.discover(tmp_path)
    assert "tests/m/build.toml" in str(raised.value)


def test_a_manifest_outside_a_module_and_duplicate_names_are_refused(tmp_path: Path) -> None:
    write(tmp_path / "tests/m/build.toml", '[[binary]]\nname = "a"\npackage = "."\ngroups = ["e2e"]\n')
    with pytest.raises(gobuild.BuildManifestError, match="no go.mod beside it"):
        gobuild.discover(tmp_path)
    write(tmp_path / "tests/m/go.mod", "module m\n")
    write(tmp_path / "tests/n/go.mod", "module n\n")
    write(tmp_path / "tests/n/build.toml", '[[binary]]\nname = "a"\npackage = "."\ngroups = ["e2e"]\n')
    with pytest.raises(gobuild.BuildManifestError, match="declared twice"):
        gobuild.discover(tmp_path)


# ---------------------------------------------------------------- stamps
def _client(repo: Path) -> gobuild.Binary:
    return next(b for b in gobuild.discover(repo) if b.name == "client")


def test_stamp_follows_module_sources_local_replaces_tags_and_go(repo: Path) -> None:
    client = _client(repo)
    first = gobuild.stamp(client, GO_VERSION)
    assert gobuild.stamp(client, GO_VERSION) == first

    write(repo / "tests/client/nested/nested.go", "package nested // a nested module is not a source\n")
    write(repo / "tests/client/__pycache__/x.pyc", "cache")
    assert gobuild.stamp(client, GO_VERSION) == first

    write(repo / "tests/local/local.go", "package local // changed\n")
    after_replace = gobuild.stamp(client, GO_VERSION)
    assert after_replace != first

    write(repo / "tests/client/go.sum", "example.com/x v1 h1:abc\n")
    after_sum = gobuild.stamp(client, GO_VERSION)
    assert after_sum != after_replace

    assert gobuild.stamp(client, "go version go1.27.0 linux/amd64") != after_sum
    retagged = gobuild.Binary(client.name, client.module_dir, client.package, ("y",), client.groups)
    assert gobuild.stamp(retagged, GO_VERSION) != after_sum
    versioned = gobuild.Binary(client.name, client.module_dir, client.package, client.tags, client.groups, ("-X a=b",))
    assert gobuild.stamp(versioned, GO_VERSION) not in (after_sum, gobuild.stamp(retagged, GO_VERSION))


def test_local_replaces_are_followed_transitively(repo: Path) -> None:
    write(repo / "tests/local/go.mod", "module example/local\n\nreplace example/base => ../base\n")
    write(repo / "tests/base/go.mod", "module example/base\n")
    assert gobuild.local_replace_dirs(repo / "tests/client") == [
        (repo / "tests/local").resolve(),
        (repo / "tests/base").resolve(),
    ]


# ---------------------------------------------------------------- binary_path (what tests call)
@pytest.mark.usefixtures("go_present")
def test_binary_path_asks_for_make_build_until_the_binary_is_current(repo: Path, bin_dir: Path) -> None:
    with pytest.raises(gobuild.BinaryNotBuilt, match=r"client is not built .*run `make build`"):
        gobuild.binary_path("client", repo)

    bin_dir.mkdir(parents=True)
    write(bin_dir / "client", "binary")
    write(bin_dir / "client.stamp", gobuild.stamp(_client(repo), GO_VERSION) + "\n")
    assert gobuild.binary_path("client", repo) == bin_dir / "client"

    write(repo / "tests/client/main.go", "package main // edited after the build\n")
    with pytest.raises(gobuild.BinaryNotBuilt, match=r"out of date .*--group conformance"):
        gobuild.binary_path("client", repo)
    with pytest.raises(gobuild.BuildManifestError, match="no build.toml declares a binary named 'nope'"):
        gobuild.binary_path("nope", repo)


@pytest.mark.usefixtures("go_present")
def test_build_all_skips_what_is_up_to_date(
    repo: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CA_MODULE_PROXY", str(tmp_path / "proxy"))
    (tmp_path / "proxy" / gobuild.PROXY_MODULES[0] / "@v").mkdir(parents=True)
    built: list[str] = []

    def fake_build(binary: gobuild.Binary, _go: str, output: Path, say: object) -> float:
        built.append(binary.name)
        output.write_text("binary")
        return 0.0

    monkeypatch.setattr(gobuild, "build", fake_build)
    lines: list[str] = []
    binaries = gobuild.discover(repo)
    gobuild.build_all(binaries, say=lines.append)
    assert built == ["client", "tool-a", "tool-b"]
    lines.clear()
    gobuild.build_all(binaries, say=lines.append)
    assert built == ["client", "tool-a", "tool-b"]
    assert lines[:3] == ["client: up to date", "tool-a: up to date", "tool-b: up to date"]


@pytest.mark.usefixtures("go_present")
def test_without_the_module_proxy_the_others_are_built_and_the_rest_named(
    repo: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CA_MODULE_PROXY", str(tmp_path / "absent"))
    built: list[str] = []

    def fake_build(binary: gobuild.Binary, _go: str, output: Path, say: object) -> float:
        built.append(binary.name)
        output.write_text("binary")
        return 0.0

    monkeypatch.setattr(gobuild, "build", fake_build)
    with pytest.raises(gobuild.ModuleProxyMissing) as raised:
        gobuild.build_all(gobuild.discover(repo), say=lambda _line: None)
    assert built == ["tool-a", "tool-b"]  # what needs no CA module is built anyway
    message = str(raised.value)
    assert message.startswith("1 binaries need the cluster-autoscaler modules of the CA module proxy and were not")
    assert "not built: client. CA_MODULE_PROXY=" in message and message.endswith("the 2 others are built")


# ---------------------------------------------------------------- the module proxy
def test_a_missing_module_proxy_names_the_variable_and_what_it_must_hold(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CA_MODULE_PROXY", str(tmp_path / "absent"))
    with pytest.raises(gobuild.ModuleProxyMissing) as raised:
        gobuild.check_module_proxy()
    message = str(raised.value)
    assert message.startswith(f"CA_MODULE_PROXY={tmp_path / 'absent'} is not a Go module proxy directory")
    assert "k8s.io/autoscaler/cluster-autoscaler" in message and "\n" not in message


def test_the_module_proxy_goes_first_in_goproxy_and_is_exempt_from_the_sum_database(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proxy = tmp_path / "proxy"
    (proxy / gobuild.PROXY_MODULES[0] / "@v").mkdir(parents=True)
    monkeypatch.setenv("CA_MODULE_PROXY", str(proxy))
    monkeypatch.setattr(
        gobuild,
        "_go_env",
        lambda _go: {"GOPROXY": "https://proxy.golang.org,direct", "GONOSUMDB": "corp.example", "GOFLAGS": ""},
    )
    env = gobuild.build_env("go", with_module_proxy=True)
    assert env["GOPROXY"] == f"{proxy.resolve().as_uri()},https://proxy.golang.org,direct"
    assert env["GONOSUMDB"] == "corp.example,k8s.io/autoscaler,sigs.k8s.io/cluster-autoscaler"
    assert env["GOFLAGS"] == "-buildvcs=false"
    monkeypatch.delenv("GOPROXY", raising=False)
    assert "GOPROXY" not in gobuild.build_env("go", with_module_proxy=False)


def test_only_modules_that_require_a_ca_module_need_the_proxy(repo: Path) -> None:
    assert gobuild.needs_module_proxy(repo / "tests/client")
    assert not gobuild.needs_module_proxy(repo / "deploy/tool")


# ---------------------------------------------------------------- failures
def test_a_failed_build_is_one_line_with_the_fix_then_gos_output(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = _client(repo)
    go_output = "go: updates to go.mod needed; to update it:\n\tgo mod tidy"

    def failing_build_all(_binaries: object) -> None:
        hint = gobuild._failure_hint(client, go_output)
        raise gobuild.GoBuildError(f"building client (. in tests/client) failed: {hint}", details=go_output)

    monkeypatch.setattr(gobuild, "build_all", failing_build_all)
    assert gobuild.main(["--name", "client"]) == 1
    first, *rest = capsys.readouterr().err.splitlines()
    assert first.startswith("gobuild: building client") and "go mod tidy" in first
    assert rest == go_output.splitlines()


@pytest.mark.parametrize(
    ("output", "hint"),
    [
        ("go: go.mod requires go >= 1.27.0 (running go 1.26.8; GOTOOLCHAIN=local)", "install a newer Go"),
        ("verifying module: missing go.sum entry for k8s.io/api", "go mod tidy"),
        (
            "k8s.io/autoscaler/cluster-autoscaler@v0.0.0-20990101000000-abcdefabcdef: not found",
            "CA_MODULE_PROXY=",
        ),
        ("dial tcp: lookup proxy.golang.org: no such host", "could not be reached"),
        ("./main.go:3:1: syntax error", "to reproduce: "),
    ],
)
def test_failure_hints_come_from_gos_words(repo: Path, output: str, hint: str) -> None:
    assert hint in gobuild._failure_hint(_client(repo), output)


def test_reproduce_command_carries_the_tags(repo: Path) -> None:
    assert gobuild._reproduce_command(_client(repo)) == "cd tests/client && go build -o /dev/null -tags x ."


def test_linker_flags_are_read_and_passed_as_one_ldflags_argument(repo: Path) -> None:
    write(
        repo / "tests/client/build.toml",
        '[[binary]]\nname = "client"\npackage = "."\ngroups = ["e2e"]\n'
        'ldflags = ["-X k8s.io/component-base/version.gitVersion=v1.36.2",\n'
        '           "-X k8s.io/component-base/version.gitMajor=1"]\n',
    )
    client = _client(repo)
    assert client.ldflags == (
        "-X k8s.io/component-base/version.gitVersion=v1.36.2",
        "-X k8s.io/component-base/version.gitMajor=1",
    )
    assert gobuild._reproduce_command(client) == (
        "cd tests/client && go build -o /dev/null -ldflags "
        "'-X k8s.io/component-base/version.gitVersion=v1.36.2 -X k8s.io/component-base/version.gitMajor=1' ."
    )


def test_progress_counts_compiled_packages_and_downloads() -> None:
    lines: list[str] = []
    progress = gobuild._Progress("client", lines.append)
    for line in ["go: downloading k8s.io/api v0.36.2", "k8s.io/api/core/v1", "# example/client", "./x.go:1: bad"]:
        progress.feed(line + "\n")
    progress.report(30.0)
    assert lines == ["  client: 1 packages compiled, 1 modules downloaded after 30s (last: k8s.io/api/core/v1)"]
    assert list(progress.tail)[-1] == "./x.go:1: bad"
