"""The event heap: (time, kind, push order) order, kinds handed back as ``EventKind`` members."""

from servelab.core.events import EventKind, EventQueue


def test_events_pop_in_time_then_kind_then_push_order():
    q = EventQueue()
    q.push(2.0, EventKind.WAKEUP, "c")
    q.push(1.0, EventKind.ARRIVAL, "b")
    q.push(1.0, EventKind.STEP_DONE, "a")
    q.push(1.0, EventKind.STEP_DONE, "a2")
    q.push(2.0, int(EventKind.STEP_DONE), "c0")  # a plain int kind is accepted too
    assert q.peek_key() == (1.0, EventKind.STEP_DONE)
    out = [q.pop() for _ in range(len(q))]
    assert [p for _, _, p in out] == ["a", "a2", "b", "c0", "c"]
    assert all(type(kind) is EventKind for _, kind, _ in out)


def test_the_heap_keeps_members_so_pop_converts_nothing():
    """Issue 29: ``EventKind(int)`` on every pop cost about a microsecond an event."""
    q = EventQueue()
    q.push(0.5, 3)
    q.push(0.25, EventKind.CALLBACK)
    assert all(type(entry[1]) is EventKind for entry in q._heap)
