"""The S3-Rec preparation procedure shared by every raw log format.

S3-Rec's ``data/data_process.py`` (BSARec's ``src/data/process/_utils.py`` is
the same code; FMLP-Rec distributes S3-Rec's files) turns (user, item, time)
rows into one sequence per user:

1. group the rows by user; users keep the order of their first appearance in
   the file (a Python dict in insertion order);
2. sort each user's rows by time with Python's stable sort, so rows with equal
   times keep their file order;
3. iterative k-core (5 for users and items): drop users and items with fewer
   than k interactions, repeated interactions counting each time, and repeat
   until nothing changes;
4. re-map ids from 1: users in the order they are kept, items in order of
   first appearance while walking the final, sorted and filtered sequences
   user by user.

Each kept interaction also keeps its real time, converted to seconds by the
reader's ``to_seconds`` (``RawSequences.times``), for models that read time
intervals; the order of step 2 is never recomputed from those seconds.

Our reading of step 4 is the one that the published files confirm: in the
distributed ``Beauty.txt`` and ``LastFM.txt`` each item id first appears
exactly one after the largest id before it when the lines are read in order,
and the user ids are 1, 2, 3, ... line by line (the test suite checks this
when the files are at hand). Numbering items by first appearance in the raw
file would in general not give that pattern, since file order is not time
order.

About step 3: S3-Rec's loop removes items from a list while iterating over it,
so the element after each removal is skipped and waits for a later pass. That
changes the number of passes, not the result: every pass removes only
interactions of users or items with too few interactions in a superset of the
maximal k-core (so outside it), and the loop stops only at a k-core; the
result is therefore the maximal k-core, which `kcore` computes directly.
(The skipping also means a list of two or more items is never emptied in one
pass, so S3-Rec never writes a user without items; neither does `kcore`.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from .errors import RawFormatError, UsageError
from .raw import IdMap, RawSequences, RawSource

DEFAULT_CORE = 5
REPEAT_REASON = "repeated (user, item) after its first row"


class Collector:
    """Rows of a raw log, grouped by user while they are read.

    Raw ids are replaced by dense integer codes in order of first appearance,
    which is the grouping order S3-Rec uses and keeps memory small on large
    logs (one code per row instead of two strings).
    """

    def __init__(
        self, *, keep_first_per_pair: bool = False, to_seconds: Callable[[Any], float] = float
    ) -> None:
        # Turns a kept row's time (the sort key the reader added) into seconds.
        self.to_seconds = to_seconds
        self.user_ids: dict[str, int] = {}
        self.item_ids: dict[str, int] = {}
        # Per user code: [(time, item code), ...] in file order.
        self.rows: list[list[tuple[Any, int]]] = []
        self.rows_added = 0
        # Rows read but not added, by reason; readers add their own reasons.
        self.skipped: dict[str, int] = {}
        self._seen: set[tuple[int, int]] | None = set() if keep_first_per_pair else None

    def add(self, user: str, item: str, time: Any) -> None:
        """Add one interaction; `time` only needs to be comparable with the others."""
        user_code = self.user_ids.setdefault(user, len(self.user_ids))
        item_code = self.item_ids.setdefault(item, len(self.item_ids))
        if self._seen is not None:
            # LastFM: one interaction per (user, artist), the first row in file order.
            pair = (user_code, item_code)
            if pair in self._seen:
                self.skipped[REPEAT_REASON] = self.skipped.get(REPEAT_REASON, 0) + 1
                return
            self._seen.add(pair)
        if user_code == len(self.rows):
            self.rows.append([])
        self.rows[user_code].append((time, item_code))
        self.rows_added += 1


def kcore(
    sequences: Sequence[Sequence[Hashable]], user_core: int, item_core: int
) -> tuple[dict[int, list[Hashable]], int]:
    """The maximal (user_core, item_core)-core of per-user item sequences.

    Returns ({index into `sequences`: filtered items in their order}, number of
    passes). Each pass drops the users with fewer than `user_core` items and
    then the items with fewer than `item_core` interactions; passes repeat until
    one changes nothing. Repeated (user, item) interactions count each time.
    """
    if user_core < 1 or item_core < 1:
        raise ValueError("cores must be at least 1")
    kept = {u: list(items) for u, items in enumerate(sequences) if items}
    passes = 0
    while True:
        passes += 1
        changed = False
        short = [u for u, items in kept.items() if len(items) < user_core]
        for u in short:
            del kept[u]
        changed |= bool(short)
        counts = Counter(item for items in kept.values() for item in items)
        rare = {item for item, n in counts.items() if n < item_core}
        if rare:
            changed = True
            for u in list(kept):
                items = [item for item in kept[u] if item not in rare]
                if items:
                    kept[u] = items
                else:
                    del kept[u]
        if not changed:
            return kept, passes


def _remapped(collector: Collector, kept: dict) -> tuple[list, list[str], list[str]]:
    """``(sequences, raw user ids, raw item ids)``: users and items numbered 1, 2, ... in
    order of first appearance (users by their first row, items as the kept sequences
    meet them), each sequence as ``(user token, item tokens)``."""
    user_names = _names(collector.user_ids)
    item_names = _names(collector.item_ids)
    new_item: dict[int, str] = {}
    out: list[tuple[str, list[str]]] = []
    raw_users: list[str] = []
    raw_items: list[str] = []
    for user_code in sorted(kept):  # user codes are in order of first appearance
        raw_users.append(user_names[user_code])
        tokens = []
        for item_code in kept[user_code]:
            token = new_item.get(item_code)
            if token is None:
                raw_items.append(item_names[item_code])
                token = new_item[item_code] = str(len(raw_items))
            tokens.append(token)
        out.append((str(len(raw_users)), tokens))
    return out, raw_users, raw_items


def prepare(
    collector: Collector,
    source: RawSource,
    *,
    user_core: int = DEFAULT_CORE,
    item_core: int = DEFAULT_CORE,
    details: dict[str, Any] | None = None,
) -> RawSequences:
    """Sort, filter and re-map collected rows (steps 2-4 in the module docstring).

    Raises `RawFormatError` (naming the file) when nothing is left.
    """
    for core in (user_core, item_core):
        if not isinstance(core, int) or isinstance(core, bool) or core < 1:
            raise UsageError(f"invalid core {core!r}: use an integer >= 1 (1 disables filtering)")
    details = dict(details or {})
    path = Path(source.path)
    if collector.rows_added == 0:
        why = "; ".join(f"{n:,} rows {reason}" for reason, n in collector.skipped.items() if n)
        raise RawFormatError(
            path, None, "no interactions found in the file" + (f" ({why})" if why else "")
        )

    by_time = itemgetter(0)
    sequences: list[list[int]] = []
    raw_times: list[list[Any]] = []
    for rows in collector.rows:
        rows.sort(key=by_time)  # list.sort is stable: equal times keep file order
        sequences.append([item for _, item in rows])
        raw_times.append([time for time, _ in rows])
    collector.rows = []  # free the (time, item) pairs early on large logs

    before = _counts(sequences)
    kept, passes = kcore(sequences, user_core, item_core)
    if not kept:
        raise RawFormatError(
            path,
            None,
            f"no interactions left after the {user_core}-core (users) / {item_core}-core "
            f"(items) filter: all {before['users']:,} users and {before['items']:,} items "
            "have too few interactions (is this the complete file? a smaller --core "
            "keeps more)",
        )

    # The core drops an item from every user at once, so a kept user's kept
    # interactions are exactly those of items that survive.
    surviving = {item for items in kept.values() for item in items}
    to_seconds = collector.to_seconds
    times = [
        [to_seconds(t) for t, item in zip(raw_times[user], sequences[user]) if item in surviving]
        for user in sorted(kept)
    ]
    del raw_times

    out, raw_users, raw_items = _remapped(collector, kept)

    after = _counts([items for items in kept.values()])
    details.update(
        {
            "rows_read": collector.rows_added + sum(collector.skipped.values()),
            "rows_skipped": dict(collector.skipped),
            "interactions_collected": collector.rows_added,
            "before_core": before,
            "core": {"user": user_core, "item": item_core, "passes": passes},
            "removed_by_core": {key: before[key] - after[key] for key in before},
        }
    )
    return RawSequences(
        source=source,
        sequences=out,
        id_map=IdMap(users=raw_users, items=raw_items),
        details=details,
        times=times,
    )


def _names(codes: dict[str, int]) -> list[str]:
    names = [""] * len(codes)
    for name, code in codes.items():
        names[code] = name
    return names


def _counts(sequences: Sequence[Sequence[Hashable]]) -> dict[str, int]:
    non_empty = [items for items in sequences if items]
    return {
        "users": len(non_empty),
        "items": len({item for items in non_empty for item in items}),
        "interactions": sum(len(items) for items in non_empty),
    }
