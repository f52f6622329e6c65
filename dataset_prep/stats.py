"""Dataset statistics and their comparison with published values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Counts follow the papers' convention: real users/items only. RecBole adds a
# padding id 0 to each id field, so its `user_num`/`item_num` are one larger.
COUNT_CONVENTION = (
    "Counts are real users/items; RecBole adds one padding id, "
    "so its user_num/item_num are one larger."
)


@dataclass(frozen=True)
class ExpectedStats:
    """Published statistics of a known dataset."""

    users: int
    items: int
    interactions: int

    def to_dict(self) -> dict[str, int]:
        return {
            "users": self.users,
            "items": self.items,
            "interactions": self.interactions,
        }


@dataclass(frozen=True)
class Stats:
    """Statistics of converted user sequences."""

    users: int
    items: int
    interactions: int
    min_seq_len: int
    max_seq_len: int

    @property
    def avg_seq_len(self) -> float:
        return self.interactions / self.users if self.users else 0.0

    @property
    def sparsity(self) -> float:
        """1 - interactions / (users * items); repeated user-item pairs count each time."""
        cells = self.users * self.items
        return 1.0 - self.interactions / cells if cells else 0.0

    def to_dict(self) -> dict[str, int | float]:
        return {
            "users": self.users,
            "items": self.items,
            "interactions": self.interactions,
            "avg_seq_len": self.avg_seq_len,
            "min_seq_len": self.min_seq_len,
            "max_seq_len": self.max_seq_len,
            "sparsity": self.sparsity,
        }

    def mismatches(self, expected: ExpectedStats) -> list[tuple[str, int, int]]:
        """(field, actual, expected) for every count that differs."""
        out = []
        for field in ("users", "items", "interactions"):
            actual, wanted = getattr(self, field), getattr(expected, field)
            if actual != wanted:
                out.append((field, actual, wanted))
        return out


def compute_stats(sequences: Sequence[tuple[str, Sequence[str]]]) -> Stats:
    """Statistics of (user, items-in-order) pairs."""
    lengths = [len(items) for _, items in sequences]
    distinct_items: set[str] = set()
    for _, items in sequences:
        distinct_items.update(items)
    return Stats(
        users=len(sequences),
        items=len(distinct_items),
        interactions=sum(lengths),
        min_seq_len=min(lengths, default=0),
        max_seq_len=max(lengths, default=0),
    )


def format_report(name: str, stats: Stats, expected: ExpectedStats | None) -> str:
    """Human-readable statistics, with a check column when `expected` is given."""
    lines = [f"{name}:"]
    for field in ("users", "items", "interactions"):
        actual = getattr(stats, field)
        row = f"  {field:<13}{actual:>12,}"
        if expected is not None:
            wanted = getattr(expected, field)
            verdict = "ok" if actual == wanted else "MISMATCH"
            row += f"   expected {wanted:>12,}  {verdict}"
        lines.append(row)
    lines.append(
        f"  {'avg seq len':<13}{stats.avg_seq_len:>12.2f}"
        f"   (min {stats.min_seq_len:,}, max {stats.max_seq_len:,})"
    )
    lines.append(f"  {'sparsity':<13}{stats.sparsity * 100:>11.4f}%")
    if expected is None:
        lines.append("  (not a known dataset: statistics not checked)")
    lines.append(f"  ({COUNT_CONVENTION})")
    return "\n".join(lines)
