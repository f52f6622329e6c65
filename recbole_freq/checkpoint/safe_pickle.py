"""The restricted unpickler behind ``checkpoint.load_checkpoint``: scan a ``torch.save``
file's pickle stream for the globals it names (parsed, never run), refuse any global off
the allowlist, and resolve the allowed ones so that only harmless ones can be called.
See ``recbole_freq.checkpoint.loader`` for what the allowlist holds and why.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import types
import zipfile

from recbole_freq.checkpoint.schema import (
    ENUM_NAMES,
    CheckpointError,
    UntrustedCheckpointError,
    config_loaders,
    model_class,
)


def _fixed_allowlist() -> dict[tuple[str, str], tuple[object, str]]:
    """``(module, name) -> (object, use)``; use is ``call``, ``new`` or ``reference``."""
    import numpy as np
    import torch
    from recbole.config import Config
    from recbole.utils import enum_type
    from torch._weights_only_unpickler import _get_allowed_globals

    from recbole_freq.config.configurator import FreqConfig

    callables = [torch.device, np.dtype, np._core.multiarray.scalar]
    callables += [getattr(enum_type, name) for name in ENUM_NAMES]
    # numpy >= 1.25 pickles a dtype through its class (``numpy.dtypes.Float64DType`` ...).
    callables += [type(np.dtype(code)) for code in "?bhilqBHILQefdgFDGUSO"]
    allow = {(obj.__module__, obj.__qualname__): (obj, "call") for obj in callables}
    # Older numpy pickles name numpy.core.multiarray.scalar.
    allow[("numpy.core.multiarray", "scalar")] = (np._core.multiarray.scalar, "call")
    # What torch's weights-only unpickler itself resolves and calls (tensor rebuilding).
    for qualified, obj in _get_allowed_globals().items():
        module, _, name = qualified.rpartition(".")
        allow.setdefault((module, name), (obj, "call"))
    for config_class in (Config, FreqConfig):
        allow[(config_class.__module__, config_class.__qualname__)] = (config_class, "new")
    for loader in config_loaders():
        allow[(loader.__module__, loader.__qualname__)] = (loader, "reference")
    return allow


def torch_weights_only_globals() -> set[str]:
    """``module.name`` of every global torch's own ``weights_only=True`` loader resolves
    by itself (tensor rebuilding, dtypes, ``OrderedDict``, ``torch.device`` ...), not
    counting any a program added with ``torch.serialization.add_safe_globals``."""
    from torch._weights_only_unpickler import _get_allowed_globals

    return set(_get_allowed_globals())


def pickled_globals(path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(module, name)`` of every global a ``torch.save`` file's pickle names.

    The pickle is parsed with ``pickletools.genops`` (a parser; nothing is executed).
    ``STACK_GLOBAL`` takes its module and name from the two values pushed before it,
    which may be memo references, so strings are tracked through the memo.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(names) != 1:
                raise CheckpointError(
                    f"{path} is not a torch checkpoint (no single data.pkl in the archive)"
                )
            data = archive.read(names[0])
    except zipfile.BadZipFile as error:
        raise CheckpointError(
            f"{path} is not a checkpoint written by torch.save (not a zip archive); only "
            "RecBole .pth checkpoints are accepted"
        ) from error
    found, pushed, memo = [], [], {}
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            name = opcode.name
            if name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                pushed.append(arg)
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                pushed.append(memo.get(int(arg)))
            elif name == "MEMOIZE":
                memo[len(memo)] = pushed[-1] if pushed else None
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = pushed[-1] if pushed else None
            elif name == "GLOBAL":
                module, _, attribute = arg.partition(" ")
                found.append((module, attribute))
                pushed.append(None)
            elif name == "STACK_GLOBAL":
                module, attribute = (pushed[-2], pushed[-1]) if len(pushed) > 1 else (None,) * 2
                if not isinstance(module, str) or not isinstance(attribute, str):
                    raise CheckpointError(f"{path}: cannot resolve a global in its pickle")
                found.append((module, attribute))
                pushed.append(None)
            elif name in ("INST", "OBJ"):
                found.append(("<opcode>", name))  # protocol-0 object building: never allowed
            elif opcode.stack_after:
                pushed.append(None)
    except CheckpointError:
        raise
    except Exception as error:  # a truncated or corrupt stream
        raise CheckpointError(f"{path}: its pickle stream is corrupt ({error})") from error
    return sorted(set(found))


def allowed_globals(names) -> dict[tuple[str, str], tuple[object, str]]:
    """The allowlist entries for ``names``; ``UntrustedCheckpointError`` for any other."""
    fixed = _fixed_allowlist()
    allow, refused = {}, []
    for module, name in names:
        if (module, name) in fixed:
            allow[(module, name)] = fixed[(module, name)]
        elif (model := model_class(module, name)) is not None:
            allow[(module, name)] = (model, "reference")
        else:
            refused.append(f"{module}.{name}")
    if refused:
        raise UntrustedCheckpointError(
            f"refusing to load: the checkpoint's pickle names {', '.join(refused)}, which a "
            "RecBole checkpoint never contains (only its Config, RecBole enums, torch "
            "devices, numpy scalars, tensors and a recommender class of recbole or "
            "recbole_freq, or of a module given to --trust_module). It may run code when "
            "unpickled; nothing was loaded."
        )
    return allow


def restricted_pickle_module(allow: dict) -> types.ModuleType:
    """A ``pickle``-like module whose ``Unpickler`` resolves only the globals in ``allow``,
    calls (``REDUCE``) only its ``call`` entries and instantiates (``NEWOBJ``) only its
    ``call`` and ``new`` entries.

    Built on the pure-Python unpickler, whose opcode table can be overridden; the pickle
    stream of a checkpoint is small (tensor data lives in separate archive records)."""
    base = pickle._Unpickler
    callable_ids = {id(obj) for obj, use in allow.values() if use == "call"}
    newable_ids = callable_ids | {id(obj) for obj, use in allow.values() if use == "new"}
    # Instances of what may only be built or referred to: never an argument of a call.
    reference_types = tuple(obj for obj, use in allow.values() if use != "call")

    def refuse(what: str):
        raise UntrustedCheckpointError(f"refusing to load: the checkpoint's pickle {what}")

    def check_arguments(target, arguments) -> None:
        """A call's arguments hold plain values, tensors and callables that may be called
        themselves, nothing else that runs: ``torch._tensor._rebuild_from_type_v2`` calls
        its first argument, and a ``Config`` class (or instance) handed to it would run
        RecBole's ``eval()`` of setting strings."""
        stack, seen = [arguments], 0
        while stack:
            item = stack.pop()
            seen += 1
            if seen > 10_000:
                refuse(f"passes {target!r} more arguments than a checkpoint ever does")
            if isinstance(item, (list, tuple)):
                stack.extend(item)
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, reference_types) or (
                callable(item) and id(item) not in callable_ids
            ):
                refuse(f"passes {item!r} to {target!r}, which may not receive it")

    class RestrictedUnpickler(base):
        dispatch = dict(base.dispatch)

        def find_class(self, module, name):
            entry = allow.get((module, name))
            if entry is None:
                refuse(f"names {module}.{name}, which is not on the allowlist")
            return entry[0]

        def load_reduce(self):
            if id(self.stack[-2]) not in callable_ids:
                refuse(f"calls {self.stack[-2]!r}, which may not be called")
            check_arguments(self.stack[-2], self.stack[-1])
            base.load_reduce(self)

        def load_newobj(self):
            if id(self.stack[-2]) not in newable_ids:
                refuse(f"instantiates {self.stack[-2]!r}, which may not be instantiated")
            check_arguments(self.stack[-2], self.stack[-1])
            base.load_newobj(self)

        def load_newobj_ex(self):
            if id(self.stack[-3]) not in newable_ids:
                refuse(f"instantiates {self.stack[-3]!r}, which may not be instantiated")
            check_arguments(self.stack[-3], (self.stack[-2], self.stack[-1]))
            base.load_newobj_ex(self)

        def load_refused(self):
            refuse("uses INST / OBJ object building, which RecBole checkpoints never do")

        dispatch[pickle.REDUCE[0]] = load_reduce
        dispatch[pickle.NEWOBJ[0]] = load_newobj
        dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
        dispatch[pickle.INST[0]] = load_refused
        dispatch[pickle.OBJ[0]] = load_refused

    module = types.ModuleType("recbole_freq_restricted_pickle")
    module.Unpickler = RestrictedUnpickler
    return module
