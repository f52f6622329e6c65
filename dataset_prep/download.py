"""``--download``: fetch a known dataset's public file, verify it, then prepare it.

Only with the flag: nothing in this package or the plugin ever downloads on its own.
Each known dataset has two sources (`SOURCES`): its raw public file (``raw``) and the
processed one-line-per-user file of the papers' repositories (``one-line``).  A file is
written to the downloads folder under its published name, whole or not at all:

- the transfer goes to ``<file>.part``; an interrupted one (network, Ctrl-C) is resumed
  from where it stopped by the same command (an HTTP range request);
- a file whose SHA-256 is recorded (`Source.sha256`) must have it; one that does not is
  kept as ``<file>.unverified`` and never used; a plain file with none recorded keeps the
  ``.part`` name until the preparation's count check (or ``--no-check``) accepted it
  (``fetch(..., defer=True)``, then ``place``): with no Content-Length, a cut transfer is
  otherwise indistinguishable from a whole one;
- a write failure (a full disk) is an error, never a shorter file, and a transfer slower
  than ``STALL_BYTES`` per ``STALL_SECONDS`` is given up, the part kept for a resume;
- ``.part`` files are opened without following links, and only as a regular file of the
  current user with no other name;
- an existing file of that name is never replaced: one with the recorded SHA-256 (or any,
  where none is recorded) is used as it is, one with another is refused;
- an archive's member (the raw file inside a zip) is extracted the same way.

The published counts (``--list``) are then checked by the preparation itself, whatever
the source, so a different file is refused there even without a recorded SHA-256.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import stat
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from .atomic import file_sha256
from .errors import DatasetPrepError, UsageError

RAW, ONE_LINE_SOURCE = "raw", "one-line"
BLOCK = 1 << 16
TIMEOUT_SECONDS = 60  # for each read
# A transfer slower than this for a whole window is given up (the part is kept): a
# server trickling a byte now and then would otherwise never end.
STALL_SECONDS = 60.0
STALL_BYTES = 1 << 14


class DownloadError(DatasetPrepError):
    """A download that cannot be done or whose file is not the published one."""


class DownloadInterrupted(DownloadError):
    """The transfer stopped early; the partial file is kept for the next attempt."""


@dataclass(frozen=True)
class Source:
    """Where a known dataset's file is published.

    ``file``: the name it is saved under; ``member``: for an archive, the file inside it
    that the preparation reads (saved under its base name); ``sha256``: of ``file``, where
    one has been established from the published file (``None``: not established, the
    counts alone verify it)."""

    url: str
    file: str
    format: str
    member: str | None = None
    sha256: str | None = None
    note: str = ""


_SNAP = "https://snap.stanford.edu/data/amazon/productGraph/categoryFiles/"
# The BSARec repository keeps the one-line files of its six datasets in src/data/
# (its README; Beauty, Sports, Toys and Yelp as FMLP-Rec published them, LastFM and
# ML-1M processed with S3-Rec's procedure).
_BSAREC_DATA = "https://raw.githubusercontent.com/yehjin-shin/BSARec/main/src/data/"
_YELP_NOTE = (
    "the Yelp Open Dataset is handed out only after accepting its licence at "
    "https://www.yelp.com/dataset: download it there and prepare it with --raw, or use "
    "--download --source one-line"
)

# No SHA-256 is recorded: none could be established from the published files here
# (no network where this was written); the published counts verify every download.
SOURCES: dict[tuple[str, str], Source | str] = {
    ("amazon-beauty", RAW): Source(
        _SNAP + "reviews_Beauty_5.json.gz", "reviews_Beauty_5.json.gz", "amazon-2014"
    ),
    ("amazon-sports-outdoors", RAW): Source(
        _SNAP + "reviews_Sports_and_Outdoors_5.json.gz",
        "reviews_Sports_and_Outdoors_5.json.gz",
        "amazon-2014",
    ),
    ("amazon-toys-games", RAW): Source(
        _SNAP + "reviews_Toys_and_Games_5.json.gz",
        "reviews_Toys_and_Games_5.json.gz",
        "amazon-2014",
    ),
    ("yelp", RAW): _YELP_NOTE,
    ("lastfm", RAW): Source(
        "https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
        "hetrec2011-lastfm-2k.zip",
        "lastfm-hetrec",
        member="user_taggedartists-timestamps.dat",
    ),
    ("ml-1m", RAW): Source(
        "https://files.grouplens.org/datasets/movielens/ml-1m.zip",
        "ml-1m.zip",
        "movielens-dat",
        member="ml-1m/ratings.dat",
    ),
    ("amazon-beauty", ONE_LINE_SOURCE): Source(
        _BSAREC_DATA + "Beauty.txt", "Beauty.txt", "one-line"
    ),
    ("amazon-sports-outdoors", ONE_LINE_SOURCE): Source(
        _BSAREC_DATA + "Sports_and_Outdoors.txt", "Sports_and_Outdoors.txt", "one-line"
    ),
    ("amazon-toys-games", ONE_LINE_SOURCE): Source(
        _BSAREC_DATA + "Toys_and_Games.txt", "Toys_and_Games.txt", "one-line"
    ),
    ("yelp", ONE_LINE_SOURCE): Source(_BSAREC_DATA + "Yelp.txt", "Yelp.txt", "one-line"),
    ("lastfm", ONE_LINE_SOURCE): Source(_BSAREC_DATA + "LastFM.txt", "LastFM.txt", "one-line"),
    ("ml-1m", ONE_LINE_SOURCE): Source(_BSAREC_DATA + "ML-1M.txt", "ML-1M.txt", "one-line"),
}


def default_source(name: str) -> str:
    """``raw`` where the raw file can be downloaded, else ``one-line``."""
    return RAW if isinstance(SOURCES.get((name, RAW)), Source) else ONE_LINE_SOURCE


def source_of(name: str, which: str) -> Source:
    """The registered source ``which`` (raw / one-line) of dataset ``name``."""
    found = SOURCES.get((name, which))
    if found is None:
        known = sorted({dataset for dataset, _ in SOURCES})
        raise UsageError(
            f"--download knows the datasets {', '.join(known)}; {name!r} is not one of them "
            "(prepare your own file with --raw)"
        )
    if isinstance(found, str):
        raise UsageError(f"{name} --source {which}: {found}")
    return found


def fetch(
    source: Source, folder: Path, url: str | None = None, show_progress=True, defer=False
) -> Path:
    """The path of ``source``'s file in ``folder`` (the member of an archive), downloaded
    (or resumed) unless it is there already; see the module docstring.

    ``defer``: a plain file with no recorded SHA-256 is returned as ``<file>.part``, its
    transfer done; the caller gives it its name (``place``) once the published counts
    have verified it, so that a truncated transfer (no Content-Length to compare, a full
    disk) never sits under the published name to be reused."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.file
    if target.exists():
        _check_existing(target, source)
    else:
        unverified = defer and source.sha256 is None and source.member is None
        _download(url or source.url, target, source, show_progress, place=not unverified)
        if unverified:
            return partial_file(target)
    if source.member is None:
        return target
    return _extract(target, source.member, folder)


def partial_file(target: Path) -> Path:
    """Where the transfer of ``target`` is written until it is verified."""
    return target.with_name(target.name + ".part")


def place(part: Path) -> Path:
    """Give a verified ``<file>.part`` (``fetch(..., defer=True)``) its published name."""
    target = part.with_name(part.name.removesuffix(".part"))
    _place(part, target)
    return target


def _check_existing(target: Path, source: Source) -> None:
    if source.sha256 is None:
        return
    found = file_sha256(target)
    if found != source.sha256:
        raise DownloadError(
            f"{target} exists but is not the published file (sha256 {found[:16]}..., "
            f"expected {source.sha256[:16]}...); it is left as it is: move it away to "
            f"download again, or prepare it yourself with --raw {target}"
        )


def _own_part(part: Path):
    """``os.stat_result`` of the partial file ``part`` if it is one this package could
    have written (a regular file of the current user with no other name), ``None`` if
    there is none; ``DownloadError`` for anything else: a link planted there would make
    the download (or extraction) write into the file it points to."""
    try:
        info = part.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
        raise DownloadError(
            f"{part} is not a partial download of this program (a link, a special file or "
            "another user's file); nothing was written to it: remove it and run the command "
            "again"
        )
    return info


def _open_part(part: Path, append: bool):
    """``part`` opened for writing without following a link: appended to if ``append``
    (a resumed transfer, after ``_own_part`` accepted it), else created anew, exclusively
    (a leftover of ours is removed first)."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if append:
        fd = os.open(part, os.O_WRONLY | os.O_APPEND | nofollow)
    else:
        if _own_part(part) is not None:
            part.unlink()
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o644)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:  # swapped since it was checked
        os.close(fd)
        raise DownloadError(f"{part} was replaced while it was opened; run the command again")
    return os.fdopen(fd, "ab" if append else "wb")


def check_url(url: str) -> None:
    """``UsageError`` unless ``url`` is an http(s) or ftp address with a host."""
    from urllib.parse import urlsplit

    from .errors import UsageError

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises only when read)
    except ValueError as error:
        raise UsageError(f"--url {shown_url(url)!r} is not a valid address ({error})") from None
    if parts.scheme not in ("http", "https", "ftp") or not parts.netloc:
        raise UsageError(
            f"--url {shown_url(url)!r} is not a download address: give an http://, https:// "
            "or ftp:// URL of a mirror of the file"
        )


def shown_url(url: str) -> str:
    """``url`` as messages show it: a password in it replaced by ``***``, and cut to 200
    characters."""
    import re

    shown = re.sub(r"(//[^/@:]*):[^/@]*@", r"\1:***@", url)
    return shown if len(shown) <= 200 else shown[:200] + "..."


def _download(url: str, target: Path, source: Source, show_progress: bool, place=True) -> None:
    check_url(url)
    part = partial_file(target)
    existing = _own_part(part)
    offset = existing.st_size if existing is not None else 0
    headers = {"User-Agent": "recbole-freq dataset_prep"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS
        )
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:  # the part is already whole
            response = None
        else:
            raise DownloadError(
                f"{shown_url(url)}: the server answered {error.code} {error.reason}"
            ) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DownloadError(
            f"cannot reach {shown_url(url)} ({reason}); check the network, or give --url of a mirror"
        ) from None
    if response is not None:
        with response:
            if offset and response.status != 206:
                offset = 0  # the server ignored the range: start again
            _receive(response, part, offset, url, show_progress)
    found = file_sha256(part)
    if source.sha256 is not None and found != source.sha256:
        unverified = target.with_name(target.name + ".unverified")
        os.replace(part, unverified)
        raise DownloadError(
            f"{shown_url(url)}: the file received has sha256 {found}, not the published "
            f"{source.sha256}; it is kept as {unverified} and not used"
        )
    if place:
        _place(part, target)


def _receive(response, part: Path, offset: int, url: str, show_progress: bool) -> None:
    length = response.headers.get("Content-Length")
    total = offset + int(length) if length is not None else None
    received = offset
    progress = _progress(total, offset, part.name, show_progress)
    window_start, window_bytes = time.monotonic(), 0
    try:
        with _open_part(part, append=bool(offset)) as out:
            try:
                while True:
                    try:
                        block = response.read1(BLOCK)  # as soon as any bytes arrive
                    except http.client.IncompleteRead as error:
                        block = error.partial  # what arrived before the connection dropped
                        _write(out, block, part)
                        received += len(block)
                        break
                    except OSError:  # the network failed: what arrived is kept
                        break
                    if not block:
                        break
                    _write(out, block, part)  # a write failure (a full disk) is an error
                    received += len(block)
                    window_bytes += len(block)
                    progress.update(len(block))
                    if time.monotonic() - window_start >= STALL_SECONDS:
                        if window_bytes < STALL_BYTES:
                            raise DownloadInterrupted(
                                f"{shown_url(url)}: the server sent {window_bytes:,} bytes in the last "
                                f"{STALL_SECONDS:g} s (at least {STALL_BYTES:,} are expected); "
                                f"{received:,} bytes are kept in {part}: run the same command "
                                "again to resume, or give --url of a mirror"
                            )
                        window_start, window_bytes = time.monotonic(), 0
            finally:
                out.flush()
                os.fsync(out.fileno())
    finally:
        progress.close()
    if total is not None and received < total:
        raise DownloadInterrupted(
            f"{shown_url(url)}: the transfer stopped after {received:,} of {total:,} bytes; the part is "
            f"kept in {part}: run the same command again to resume"
        )


def _write(out, block: bytes, part: Path) -> None:
    try:
        out.write(block)
    except OSError as error:
        raise DownloadInterrupted(
            f"cannot write {part}: {error.strerror or error}; the bytes received so far are "
            "kept there: free space and run the same command again to resume"
        ) from None


def _progress(total, done, label, show):
    from tqdm import tqdm

    return tqdm(
        total=total, initial=done, unit="B", unit_scale=True, desc=label, disable=not show,
        leave=False,
    )  # fmt: skip


def _place(part: Path, target: Path) -> None:
    """``part`` becomes ``target`` unless a file of that name appeared meanwhile."""
    try:
        os.link(part, target)
    except FileExistsError:
        raise DownloadError(
            f"{target} appeared while downloading; it is left as it is and the download is "
            f"kept as {part}"
        ) from None
    part.unlink()


def _extract(archive: Path, member: str, folder: Path) -> Path:
    target = folder / Path(member).name
    try:
        with zipfile.ZipFile(archive) as opened:
            info = opened.getinfo(member)
            if target.exists():
                if target.stat().st_size != info.file_size or _member_sha256(
                    opened, member
                ) != file_sha256(target):
                    raise DownloadError(
                        f"{target} exists but is not {member} of {archive}; it is left as it "
                        "is: move it away, or prepare it yourself with --raw"
                    )
                return target
            part = target.with_name(target.name + ".part")
            with opened.open(info) as data, _open_part(part, append=False) as out:
                shutil.copyfileobj(data, out, BLOCK)
                out.flush()
                os.fsync(out.fileno())
    except DAMAGED_ARCHIVE as error:
        # Never left under the published name, where a rerun would take it as fetched.
        damaged = archive.with_name(archive.name + ".damaged")
        os.replace(archive, damaged)
        with contextlib.suppress(FileNotFoundError):
            target.with_name(target.name + ".part").unlink()
        raise DownloadError(
            f"{archive} is not a usable archive ({type(error).__name__}: {error}); it is kept "
            f"as {damaged} and not used: run the command again to download it again (--url "
            "names a mirror)"
        ) from None
    _place(part, target)
    return target


# What reading a damaged, foreign or encrypted zip raises (zlib.error: damaged deflate
# data; NotImplementedError: an unknown compression method; RuntimeError: encryption).
DAMAGED_ARCHIVE = (
    zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, zlib.error, NotImplementedError,
    RuntimeError, EOFError, ValueError,
)  # fmt: skip


def _member_sha256(opened: zipfile.ZipFile, member: str) -> str:
    digest = hashlib.sha256()
    with opened.open(member) as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
