"""numactl in front of a rank an MPI starts (numa.py): the cores each local rank gets, its
memory policy on plain, fake-NUMA and flat-HBM machines (topologies given, and one read from
a sysfs-like folder), and the core-list rules DeepSpeed's `parse_range_list` has."""

from __future__ import annotations

import pytest

from zerostream.launcher import cores, numa

TWO_SOCKETS = {0: list(range(0, 4)), 1: list(range(4, 8))}


def test_cores_in_one_node_keep_their_memory_there():
    assert numa.numactl_argv([4, 5], TWO_SOCKETS) == ["numactl", "-m", "1", "-C", "4-5"]


def test_cores_over_two_nodes_get_no_memory_policy():
    assert numa.numactl_argv([3, 4], TWO_SOCKETS) == ["numactl", "-C", "3-4"]


def test_fake_numa_binds_to_every_node_of_the_same_cpus():
    fake = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    assert numa.memory_policy([2, 3], fake) == ["-m", "2,3"]


def test_flat_hbm_prefers_the_memory_only_node_paired_with_the_cpus():
    hbm = {0: [0, 1], 1: [2, 3], 2: [], 3: []}
    assert numa.memory_policy([2], hbm) == ["-p", "3"]
    assert numa.memory_policy([0, 1], hbm) == ["-p", "2"]


def test_rank_binding_splits_the_pool_and_refuses_kmp_affinity():
    pool = cores.parse_core_list("0-5,8", ascending=True)
    assert numa.rank_binding(pool, 2, 1, TWO_SOCKETS, {}) == (3, ["numactl", "-C", "3-5"])
    assert numa.rank_binding(pool, 3, 0, TWO_SOCKETS, {}) == (
        2,
        ["numactl", "-m", "0", "-C", "0-1"],
    )
    with pytest.raises(ValueError, match=r"local rank 2: expected 0-1 \(2 local ranks\)"):
        numa.rank_binding(pool, 2, 2, TWO_SOCKETS, {})
    with pytest.raises(ValueError, match=r"KMP_AFFINITY='scatter' is set"):
        numa.rank_binding(pool, 2, 0, TWO_SOCKETS, {"KMP_AFFINITY": "scatter"})


def test_node_cpus_reads_sysfs_lists_and_memory_only_nodes(tmp_path):
    for node, text in ((0, "0-3,8-11\n"), (1, "4-7,12-15\n"), (2, "\n")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(text)
    (tmp_path / "online").write_text("0-2\n")  # not a node folder
    found = numa.node_cpus(str(tmp_path))
    assert found == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15], 2: []}
    assert numa.node_cpus(str(tmp_path / "absent")) == {}


def test_format_ranges_is_the_inverse_of_the_core_list():
    assert cores.format_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert cores.parse_core_list(cores.format_ranges([3, 9, 10, 11])) == [3, 9, 10, 11]


@pytest.mark.parametrize(
    "text, message",
    [
        ("0,2-6,5-9", "'5-9' starts at or before core 6"),
        ("8,2-6", "'2-6' starts at or before core 8"),
        ("1,6-2", "range '6-2' runs backwards"),
    ],
)
def test_ascending_core_lists_name_the_item_out_of_order(text, message):
    with pytest.raises(ValueError) as err:
        cores.parse_core_list(text, flag="--bind_core_list", ascending=True)
    assert str(err.value).startswith(f"--bind_core_list {text}: {message}")


def test_zerostream_runs_own_core_list_keeps_the_order_given():
    assert cores.parse_core_list("8,2-4") == [8, 2, 3, 4]
