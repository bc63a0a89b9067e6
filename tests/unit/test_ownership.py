"""Rendezvous ownership of ephemeral queues (broker/service/ownership.py).

Invariants: every broker that sees the same members picks the same owner, among them; when
a broker leaves, only the queues it owned move; when one joins, queues move only to it; the
queues spread over the members."""
from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from broker.service.ownership import owner_of

names = st.text(min_size=1, max_size=40)
member_sets = st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=6, unique=True)


@given(queue=names, members=member_sets)
def test_the_owner_is_a_member_and_does_not_depend_on_their_order(queue, members):
    owner = owner_of(members, queue)
    assert owner in members
    assert owner_of(list(reversed(members)), queue) == owner
    assert owner_of(sorted(members), queue) == owner


@given(queues=st.lists(names, min_size=1, max_size=50), members=member_sets,
       leaving=st.integers(min_value=0))
def test_a_leaving_broker_moves_only_its_own_queues(queues, members, leaving):
    if len(members) < 2:
        return
    gone = members[leaving % len(members)]
    rest = [m for m in members if m != gone]
    for queue in queues:
        before = owner_of(members, queue)
        if before != gone:
            assert owner_of(rest, queue) == before


@given(queues=st.lists(names, min_size=1, max_size=50), members=member_sets,
       newcomer=st.text(min_size=1, max_size=20))
def test_a_joining_broker_takes_queues_only_for_itself(queues, members, newcomer):
    if newcomer in members:
        return
    for queue in queues:
        after = owner_of([*members, newcomer], queue)
        assert after in (owner_of(members, queue), newcomer)


def test_queues_spread_over_the_members():
    members = ["queen-0", "queen-1", "queen-2"]
    owners = Counter(owner_of(members, f"queue-{n}") for n in range(3000))
    assert set(owners) == set(members)
    assert all(800 <= count <= 1200 for count in owners.values()), owners
