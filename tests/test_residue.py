"""The deep residue walk (harness.role.residue.find_rooms) finds per-room state wherever a
manager keeps it: each kind the old one-level scan missed is planted here."""

import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch

from harness.role.residue import find_rooms

ROOM, OTHER, NEVER_OPENED = 7_301_000_000_001, 7_301_000_000_002, 7_301_000_000_003


@dataclass
class Staging:
    outstanding: dict = field(default_factory=dict)


class Info:
    __slots__ = ("room", "rank")

    def __init__(self, room, rank):
        self.room, self.rank = room, rank


class Manager:
    def __init__(self):
        self.request_status = {ROOM: 4}  # int key, one level (the old scan saw this)
        self.addr_to_rooms_tracker = defaultdict(set, {"10.0.0.1:9": {ROOM}})
        self.staging = Staging({(OTHER, 0): 3})  # a sub-object with a tuple key
        self.transfer_infos = {"peer": [Info(OTHER, 1)]}  # slots object inside a list inside a dict
        self.failures = {f"room_{NEVER_OPENED}": "boom"}  # string key, a room this role never opened
        self.queue = deque([{"nested": {"deeper": [ROOM]}}])
        self.worker = threading.Thread(target=lambda: None)  # machinery is not walked
        self.pool = torch.zeros(4)
        self.clean = {1: 2}


def test_every_kind_of_residue_is_found():
    found = find_rooms(Manager(), [ROOM, OTHER, NEVER_OPENED]).rooms
    assert found[ROOM] == sorted(["request_status[7301000000001]", "addr_to_rooms_tracker['10.0.0.1:9']{}",
                                  "queue[0]['nested']['deeper'][0]"])
    assert found[OTHER] == ["staging.outstanding[(7301000000002, 0)]", "transfer_infos['peer'][0].room"]
    assert found[NEVER_OPENED] == ["failures['room_7301000000003']"]


def test_a_clean_manager_and_unrelated_numbers_are_not_residue():
    class Clean:
        def __init__(self):
            self.request_status = {}
            self.ports = {"p": 17301000000001}  # a longer number that contains the room's digits
            self.name = f"x{ROOM}0"

    assert find_rooms(Clean(), [ROOM]).rooms == {}


def test_ignored_attributes_and_cycles():
    m = Manager()
    m.me = m  # a cycle ends
    found = find_rooms(m, [ROOM], ignore=("request_status", "addr_to_rooms_tracker", "queue"))
    assert found.rooms == {} and found.incomplete == ""


def test_what_the_review_found_missing_is_found():
    import enum
    from dataclasses import dataclass as dc

    import numpy as np

    @dc(frozen=True)
    class Key:
        room: int
        rank: int

    class Base:
        __slots__ = ("inherited",)

    class Slotted(Base):
        __slots__ = "room"  # a bare string is one name

        def __init__(self):
            self.inherited, self.room = {ROOM: 1}, OTHER

    class M:
        def __init__(self):
            self.np_keys = {np.int64(ROOM): 1}
            self.slotted = Slotted()
            self.frozen = {frozenset({NEVER_OPENED, 3}): 1}
            self.object_keys = {Key(OTHER, 0): "x"}

    found = find_rooms(M(), [ROOM, OTHER, NEVER_OPENED]).rooms
    assert "np_keys[np.int64(7301000000001)]" in found[ROOM] or any(p.startswith("np_keys[") for p in found[ROOM])
    assert "slotted.inherited[7301000000001]" in found[ROOM]
    assert "slotted.room" in found[OTHER] and any(p.startswith("object_keys[") for p in found[OTHER])
    assert any(p.startswith("frozen[") for p in found[NEVER_OPENED])


def test_objects_that_refuse_to_be_read_are_skipped_and_bounds_are_said():
    class Hostile:
        def __getattribute__(self, name):
            raise RuntimeError("pybind11: cannot read")

    class M:
        def __init__(self):
            self.hostile = Hostile()
            self.big = {i: None for i in range(60_000)}
            self.big_bytes = b"x" * (2 << 20) + str(ROOM).encode()
            self.kept = {ROOM: 1}

    walk = find_rooms(M(), [ROOM])
    assert walk.rooms == {ROOM: ["kept[7301000000001]"]}  # the 2 MiB byte string is not searched
    assert "more than 50000 items" in walk.incomplete


def test_observations_look_for_every_room_the_manager_holds_not_only_the_harness_ones():
    # A room the harness never opened (a late message's, another engine's) left in a
    # manager's status map is residue too: the walk is asked for it.
    from types import SimpleNamespace

    from backends.sglang_common import SglangCommonRole
    from harness.role.residue import find_rooms

    manager = SimpleNamespace(request_status={7: 1, 99: 4}, failure_records={123: "x"}, transfer_infos={},
                              other={5: 1})
    held = SglangCommonRole._held_rooms(SimpleNamespace(manager=manager, ROOM_MAPS=SglangCommonRole.ROOM_MAPS))
    assert held == {7, 99, 123}  # only the room maps' keys: 5 is not a room
    assert set(find_rooms(manager, held).rooms) == {7, 99, 123}
