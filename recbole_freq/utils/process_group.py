"""Which process of a data-parallel run this is, where the processes meet, and what
the writing process tells the others: the few facts about a run's process group that
RecBole's fixes (``compat``), the protocol's trainer and the launcher
(``quick_start.distributed``) share."""

from __future__ import annotations

# The file through which this launched process meets the others (``None``: RecBole's
# ``tcp://ip:port``).  A port picked free by the launcher could be taken by another
# program before process 0 binds it, seconds later; a fresh file cannot.
_rendezvous_file: str | None = None


def meet_through_file(path: str | None) -> None:
    """Make ``init_method`` name ``path`` (``None``: RecBole's ``tcp://ip:port``)."""
    global _rendezvous_file
    _rendezvous_file = path


def init_method(config_values) -> str:
    """Where the processes of this run meet, for ``init_process_group``."""
    if _rendezvous_file is not None:
        return f"file://{_rendezvous_file}"
    return f"tcp://{config_values['ip']}:{config_values['port']}"


def writing_rank(config) -> bool:
    """Whether this process writes the run's files: the only process of a plain run, or
    global rank 0 (``local_rank + offset``) of a data-parallel one (fixes 14-16)."""

    def value(key):
        try:
            return config[key]
        except KeyError:
            return None

    if value("single_spec") is not False:
        return True
    return int(value("local_rank") or 0) + int(value("offset") or 0) == 0


def broadcast_from_writer(value):
    """``value`` of global rank 0, on every rank."""
    import torch.distributed

    holder = [value]
    torch.distributed.broadcast_object_list(holder, src=0)
    return holder[0]
