"""room_residue finds per-room state wherever a manager keeps it."""

from collections import defaultdict

from backends.sglang_hooks import room_residue


class FakeManager:
    def __init__(self):
        self.request_status = {11: 4, 12: 0}
        self.failure_records = {12: "boom"}
        self.addr_to_rooms_tracker = defaultdict(set, {"127.0.0.1:9": {11, 99}})
        self.rank_port = 11  # an int attribute equal to a room id is not state for it
        self.pending = [12]


def test_residue_paths():
    found = room_residue(FakeManager(), [11, 12, 13])
    assert sorted(found[11]) == ["addr_to_rooms_tracker['127.0.0.1:9']", "request_status"]
    assert sorted(found[12]) == ["failure_records", "pending", "request_status"]
    assert 13 not in found
