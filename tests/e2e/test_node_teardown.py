"""The real node's teardown check (tests/e2e/node_host.py, ``leftovers``) finds what a node leaves behind.

Every real-node scenario ends by asserting that the check finds nothing; this shows the check can find
something: the traces a node leaves (a process in its cgroups, its namespaces still held, a mount in its
mount namespace, its cgroup directories, a changed kernel setting) are made by hand, found, and then
removed by the teardown steps the node uses, after which the check comes back empty. Root only, no node
programs needed; it holds the node lock, so it never runs beside a real node.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.node import WATCHED_PATHS, why_no_node
from tests.e2e.node_host import (
    KUBELET_SYSCTLS,
    HostSnapshot,
    HostState,
    NodeNamespaces,
    cgroup_dirs,
    leftovers,
    make_cgroups,
    node_lock,
    read_sysctl,
    remove_cgroups,
    restore_sysctls,
    stop_processes,
    sweep_previous,
    write_sysctl,
)

#: a kernel setting the kubelet raises, harmless to change for a moment
SETTING = "kernel/keys/root_maxkeys"


@pytest.mark.node
@pytest.mark.timeout(120)
def test_the_teardown_check_finds_what_a_node_leaves_and_nothing_after_the_teardown(tmp_path: Path) -> None:
    reason = why_no_node()
    if reason:
        pytest.skip(reason)
    with node_lock(60, print):
        sweep_previous(print)
        before = HostSnapshot.take(WATCHED_PATHS)
        namespaces = NodeNamespaces(tmp_path / "namespaces.log").start()
        original = read_sysctl(SETTING)
        assert original is not None
        state = HostState(
            holder_pid=namespaces.pid,
            net_inode=namespaces.net_inode,
            mnt_inode=namespaces.mnt_inode,
            state_dir=str(tmp_path / "node"),
            programs=[],
            sysctls={name: value for name in KUBELET_SYSCTLS if (value := read_sysctl(name)) is not None},
        )
        stray = None
        try:
            # What a node that stopped badly would leave: a process in its cgroups, a mount of its
            # folder in its mount namespace, the namespaces held, a kernel setting changed.
            make_cgroups()
            stray = subprocess.Popen(["sleep", "300"])
            (cgroup_dirs()[0] / "cgroup.procs").write_text(str(stray.pid))
            (tmp_path / "node" / "mounted").mkdir(parents=True)
            namespaces.run("mount", "-t", "tmpfs", "stray", str(tmp_path / "node" / "mounted"))
            write_sysctl(SETTING, str(int(original) + 1))

            found = leftovers(state, before, WATCHED_PATHS)
            text = "\n".join(found)
            assert f"process {stray.pid} in cgroup" in text, text
            assert f"process {namespaces.pid} in the node's network namespace" in text, text
            assert f"mount {tmp_path / 'node' / 'mounted'}" in text, text
            assert any(line.startswith("cgroup ") for line in found), text
            assert "the node's net namespace is still held" in text, text
            assert f"kernel setting {SETTING} is {int(original) + 1}, was {original}" in text, text
        finally:
            # The node's own teardown steps, in its order.
            stop_processes(state, print)
            namespaces.stop()
            remove_cgroups(print)
            restore_sysctls(state.sysctls, print)
            if stray is not None:
                stray.wait(timeout=10)
        assert leftovers(state, before, WATCHED_PATHS) == []
        assert read_sysctl(SETTING) == original
        assert not any(d.exists() for d in cgroup_dirs())
        assert os.path.ismount(tmp_path / "node" / "mounted") is False
