"""Hostfiles, --include/--exclude and core splitting, against DeepSpeed's documented rules
(`deepspeed/launcher/runner.py`: `_parse_hostfile`, `parse_resource_filter`)."""

from __future__ import annotations

import pytest

from zerostream.launcher import cores
from zerostream.launcher.resources import (
    Node,
    decode_world_info,
    encode_world_info,
    filter_slots,
    parse_filter,
    parse_hostfile,
    select_nodes,
)

TWO_WORKERS = "worker-0 slots=4\nworker-1 slots=4\n"


@pytest.fixture
def hostfile(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "hostfile"
        path.write_text(text)
        return str(path)

    return write


def test_hostfile_with_comments_blank_lines_and_extra_keys(hostfile):
    path = hostfile(
        "# cluster A\n"
        "\n"
        "worker-0 slots=8\n"
        "   # indented comment\n"
        "worker-1 slots=2   # the small one\n"
        "worker-2\tslots=4 max_slots=4\n"
    )
    hosts = parse_hostfile(path)
    assert list(hosts) == ["worker-0", "worker-1", "worker-2"]
    assert [h.slots for h in hosts.values()] == [8, 2, 4]
    assert [h.origin for h in hosts.values()] == [f"{path}:3", f"{path}:5", f"{path}:6"]


def test_duplicate_host_names_both_lines(hostfile):
    path = hostfile("worker-0 slots=4\n# again:\nworker-0 slots=2\n")
    with pytest.raises(ValueError) as err:
        parse_hostfile(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:3: host 'worker-0' is listed twice (first at {path}:1)")


@pytest.mark.parametrize(
    "line",
    ["worker-1 slots=four", "worker-1", "worker-1 slots=", "worker-1 slots=-2", "slots=4"],
)
def test_bad_line_is_named_with_file_and_line(hostfile, line):
    path = hostfile(f"worker-0 slots=4\n{line}\n")
    with pytest.raises(ValueError) as err:
        parse_hostfile(path)
    assert str(err.value).startswith(f"{path}:2: expected 'HOST slots=N'")
    assert repr(line) in str(err.value)


def test_zero_slots_and_empty_files_are_refused(hostfile):
    path = hostfile("worker-0 slots=0\n")
    with pytest.raises(ValueError, match=r":1: host 'worker-0' has slots=0"):
        parse_hostfile(path)
    path = hostfile("# nothing here\n\n")
    with pytest.raises(ValueError, match="no 'HOST slots=N' line"):
        parse_hostfile(path)


def test_missing_hostfile_names_the_flag(tmp_path):
    with pytest.raises(ValueError, match=r"--hostfile .*nope: cannot read it"):
        parse_hostfile(str(tmp_path / "nope"))


def test_include_slots_on_one_host_and_all_of_another(hostfile):
    hosts = parse_hostfile(hostfile(TWO_WORKERS))
    assert select_nodes(hosts, include="worker-0:0,2@worker-1") == [
        Node("worker-0", (0, 2)),
        Node("worker-1", (0, 1, 2, 3)),
    ]


def test_include_keeps_hostfile_order_and_drops_unnamed_hosts(hostfile):
    hosts = parse_hostfile(hostfile(TWO_WORKERS + "worker-2 slots=2\n"))
    assert select_nodes(hosts, include="worker-2@worker-0:3,1,3") == [
        Node("worker-0", (1, 3)),
        Node("worker-2", (0, 1)),
    ]
    # a whole host and some of its slots: the whole host
    assert select_nodes(hosts, include="worker-1:2@worker-1") == [Node("worker-1", (0, 1, 2, 3))]


def test_exclude_a_slot_or_a_whole_host(hostfile):
    hosts = parse_hostfile(hostfile(TWO_WORKERS))
    assert select_nodes(hosts, exclude="worker-1:0") == [
        Node("worker-0", (0, 1, 2, 3)),
        Node("worker-1", (1, 2, 3)),
    ]
    assert select_nodes(hosts, exclude="worker-0") == [Node("worker-1", (0, 1, 2, 3))]
    assert select_nodes(hosts, exclude="worker-0:0,1,2,3@worker-1:3") == [
        Node("worker-1", (0, 1, 2))
    ]


@pytest.mark.parametrize(
    "flag, spec, message",
    [
        ("include", "worker-9:0", "--include: host 'worker-9' is not among the hosts"),
        ("exclude", "worker-9", "--exclude: host 'worker-9' is not among the hosts"),
        ("include", "worker-0:4", "--include: host 'worker-0' has no slot 4; it has slots 0-3"),
        ("include", "worker-0:a", "--include worker-0:a: slot 'a' of host 'worker-0'"),
        ("include", "worker-0:", "--include worker-0:: slot '' of host 'worker-0'"),
        ("exclude", "@worker-0", "--exclude @worker-0: empty host name"),
        ("exclude", "worker-0@worker-1", "--exclude worker-0@worker-1: leaves no slot"),
    ],
)
def test_filter_errors_name_the_flag_and_what_is_wrong(hostfile, flag, spec, message):
    path = hostfile(TWO_WORKERS)
    with pytest.raises(ValueError) as err:
        select_nodes(parse_hostfile(path), **{flag: spec})
    assert str(err.value).startswith(message), str(err.value)
    if "no slot 4" in message:
        assert f"slots=4 at {path}:1" in str(err.value)


def test_num_nodes_takes_the_first_hosts_and_num_gpus_the_first_slots(hostfile):
    hosts = parse_hostfile(hostfile(TWO_WORKERS))
    assert select_nodes(hosts, num_nodes=1) == [Node("worker-0", (0, 1, 2, 3))]
    assert select_nodes(hosts, num_gpus=2) == [Node("worker-0", (0, 1)), Node("worker-1", (0, 1))]
    with pytest.raises(ValueError, match=r"--num_nodes 3: only 2 host\(s\)"):
        select_nodes(hosts, num_nodes=3)
    with pytest.raises(ValueError, match=r"--num_gpus 5: host 'worker-0' has 4 slot\(s\)"):
        select_nodes(hosts, num_gpus=5)


def test_filter_syntax():
    assert parse_filter("a:1,0@b@a:2", "--include") == {"a": [0, 1, 2], "b": []}


def test_cores_split_disjoint_and_equal_leaving_the_remainder():
    assert cores.split_cores([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3]]
    assert cores.split_cores(cores.parse_core_list("8-11,2"), 3) == [[8], [9], [10]]
    with pytest.raises(ValueError, match=r"--bind_cores_to_rank: 1 core\(s\) \(0\) for 2 local"):
        cores.split_cores([0], 2)
    for bad in ("1,x", "5-3", "1,1", "1-"):
        with pytest.raises(ValueError, match=r"--bind_core_list"):
            cores.parse_core_list(bad)


def test_filter_slots_works_on_any_slot_lists_and_may_leave_nothing():
    pool = {"worker-0": [0, 2, 3], "worker-1": [1]}
    assert filter_slots(pool) == pool
    assert filter_slots(pool, exclude="worker-0:2") == {"worker-0": [0, 3], "worker-1": [1]}
    assert filter_slots(pool, exclude="worker-0@worker-1") == {}
    assert list(filter_slots(pool, include="worker-1@worker-0:3")) == ["worker-0", "worker-1"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"include": "a", "exclude": "b"}, "--include and --exclude are mutually exclusive"),
        ({"include": "jeff"}, "--include: host 'jeff' is not among the hosts (worker-0, worker-1)"),
        ({"exclude": "worker-0:1"}, "--exclude: host 'worker-0' has no slot 1; it has slots 0,2,3"),
        ({"include": "worker-1:4"}, "--include: host 'worker-1' has no slot 4; it has slots 0-0"),
        ({"exclude": "worker-1@worker-0:2@5"}, "--exclude: host '5' is not among the hosts"),
    ],
)
def test_filter_slots_errors_name_the_host_or_slot(kwargs, message):
    with pytest.raises(ValueError) as err:
        filter_slots({"worker-0": [0, 2, 3], "worker-1": [0]}, **kwargs)
    assert str(err.value).startswith(message), str(err.value)


def test_world_info_round_trip_keeps_node_order_and_slots():
    word = encode_world_info({"worker-1": [0, 2], "worker-0": 3})
    assert set(word) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")
    assert decode_world_info(word) == [Node("worker-1", (0, 2)), Node("worker-0", (0, 1, 2))]


@pytest.mark.parametrize(
    "word, message",
    [
        ("not base64!", "--world_info 'not base64!': not base64 JSON"),
        (encode_world_info({}), "--world_info: expected a non-empty {host: [slots]}"),
        (encode_world_info({"w": []}), "--world_info: host 'w' has slots []"),
        (encode_world_info({"w": [0, -1]}), "--world_info: host 'w' has slots [0, -1]"),
    ],
)
def test_bad_world_info_is_refused_naming_the_host(word, message):
    with pytest.raises(ValueError) as err:
        decode_world_info(word)
    assert str(err.value).startswith(message), str(err.value)
