"""``python -m dataset_prep NAME --download`` against a local HTTP server serving fixtures
(these machines have no internet): fetch, resume, verify, never overwrite, prepare."""

from __future__ import annotations

import hashlib
import io
import os
import random
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import write_sequences
from dataset_prep import download
from dataset_prep.cli import main
from dataset_prep.download import ONE_LINE_SOURCE, RAW, Source
from recbole_freq.data.guard import not_prepared_error


class FixtureServer(ThreadingHTTPServer):
    """Serves ``files`` (name -> bytes) with range requests; ``cut[name] = n`` makes the
    next response for ``name`` stop after ``n`` bytes, as a dropped connection does."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FixtureHandler)
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.no_length: set[str] = set()  # sent without Content-Length
        self.slow: dict[str, float] = {}  # seconds between bytes

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


class FixtureHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        name = self.path.lstrip("/")
        asked = self.headers.get("Range")
        self.server.requests.append((name, asked))
        data = self.server.files.get(name)
        if data is None:
            self.send_error(404)
            return
        start = int(asked.removeprefix("bytes=").rstrip("-")) if asked else 0
        if start >= len(data):
            self.send_error(416)
            return
        body = data[start:]
        self.send_response(206 if asked else 200)
        if name not in self.server.no_length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = self.server.cut.pop(name, None)
        body = body if cut is None else body[:cut]
        if name in self.server.slow:
            for index in range(len(body)):
                self.wfile.write(body[index : index + 1])
                self.wfile.flush()
                time.sleep(self.server.slow[name])
        else:
            self.wfile.write(body)
        self.wfile.flush()
        if cut is not None or name in self.server.no_length:
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = FixtureServer()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def one_line_fixture(tmp_path) -> bytes:
    return write_sequences(tmp_path / "fixture.txt", n_users=40, n_items=30).read_bytes()


def lastfm_archive() -> tuple[bytes, bytes]:
    """A hetrec2011-lastfm-2k.zip holding a small user_taggedartists-timestamps.dat."""
    rng = random.Random(3)
    rows = ["userID\tartistID\ttagID\ttimestamp"]
    for user in range(2, 32):
        for step, artist in enumerate(rng.sample(range(100, 130), 12)):
            rows.append(
                f"{user}\t{artist}\t{rng.randint(1, 50)}\t{1_200_000_000_000 + step * 1000}"
            )
    dat = ("\n".join(rows) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("user_taggedartists-timestamps.dat", dat)
        archive.writestr("artists.dat", b"id\tname\n")
    return buffer.getvalue(), dat


def publish(monkeypatch, server, name, which, file, data, fmt, sha256=True, member=None):
    """Serve ``data`` as ``file`` and point the registry's source at it."""
    server.files[file] = data
    digest = hashlib.sha256(data).hexdigest() if sha256 is True else sha256
    source = Source(server.url(file), file, fmt, member=member, sha256=digest)
    monkeypatch.setitem(download.SOURCES, (name, which), source)


def publish_lastfm_archive(monkeypatch, server, sha256=True) -> tuple[bytes, bytes]:
    """``lastfm_archive()`` served as HetRec's raw LastFM source; returns it."""
    archive, dat = lastfm_archive()
    publish(
        monkeypatch, server, "lastfm", RAW, "hetrec2011-lastfm-2k.zip", archive,
        "lastfm-hetrec", sha256=sha256, member="user_taggedartists-timestamps.dat",
    )  # fmt: skip
    return archive, dat


def test_download_fetches_verifies_and_prepares(tmp_path, server, monkeypatch, capsys):
    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")
    out = tmp_path / "dataset"
    command = ["lastfm", "--download", "--source", "one-line", "--out", str(out), "--quiet"]
    # The published counts are always checked: the fixture is not LastFM.
    assert main(command) == 2
    assert "Use --no-check to write it anyway" in capsys.readouterr().err
    assert not (out / "lastfm" / "lastfm.inter").exists()
    assert (out / "downloads" / "LastFM.txt").read_bytes() == data
    # Written anyway on request, from the file already downloaded (no second transfer).
    assert main([*command, "--no-check"]) == 0
    assert (out / "lastfm" / "lastfm.inter").is_file()
    assert server.requests == [("LastFM.txt", None)]
    assert "wrote" in capsys.readouterr().out


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path, server, monkeypatch, capsys):
    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")
    server.cut["LastFM.txt"] = 1000
    out = tmp_path / "dataset"
    command = ["lastfm", "--download", "--source=one-line", f"--out={out}", "--quiet", "--no-check"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "stopped after 1,000 of" in err and "run the same command again to resume" in err
    part = out / "downloads" / "LastFM.txt.part"
    assert part.read_bytes() == data[:1000] and not (out / "downloads" / "LastFM.txt").exists()
    assert main(command) == 0
    assert server.requests[-1] == ("LastFM.txt", "bytes=1000-")
    assert (out / "downloads" / "LastFM.txt").read_bytes() == data and not part.exists()


def test_a_file_that_is_not_the_published_one_is_never_used(tmp_path, server, monkeypatch, capsys):
    data = one_line_fixture(tmp_path)
    publish(
        monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line",
        sha256="0" * 64,
    )  # fmt: skip
    out = tmp_path / "dataset"
    command = ["lastfm", "--download", "--source", "one-line", "--out", str(out), "--quiet"]
    assert main(command) == 1
    assert "not the published" in capsys.readouterr().err
    downloads = out / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == ["LastFM.txt.unverified"]
    assert not (out / "lastfm").exists()


def test_an_existing_different_file_is_never_replaced(tmp_path, server, monkeypatch, capsys):
    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")
    out = tmp_path / "dataset"
    (out / "downloads").mkdir(parents=True)
    mine = out / "downloads" / "LastFM.txt"
    mine.write_text("1 2 3 4 5\n")
    command = ["lastfm", "--download", "--source", "one-line", "--out", str(out), "--quiet"]
    assert main(command) == 1
    assert "exists but is not the published file" in capsys.readouterr().err
    assert mine.read_text() == "1 2 3 4 5\n" and server.requests == []


def test_a_raw_archive_is_fetched_and_its_member_prepared(tmp_path, server, monkeypatch):
    _, dat = publish_lastfm_archive(monkeypatch, server)
    out = tmp_path / "dataset"
    assert main(["lastfm", "--download", "--out", str(out), "--quiet", "--no-check"]) == 0
    assert (out / "downloads" / "user_taggedartists-timestamps.dat").read_bytes() == dat
    inter = (out / "lastfm" / "lastfm.inter").read_text().splitlines()
    assert inter[0].startswith("user_id:token") and len(inter) == 1 + 30 * 12
    # Again: the archive and its member are there; nothing is fetched or replaced.
    assert main(["lastfm", "--download", "--out", str(out), "--quiet", "--no-check"]) == 0
    assert len(server.requests) == 1


def test_nothing_is_downloaded_without_the_flag_and_the_plugin_names_the_command(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["lastfm", "--out", str(tmp_path)])
    assert "missing --raw" in capsys.readouterr().err
    message = str(not_prepared_error("amazon-beauty", str(tmp_path / "amazon-beauty")))
    assert f"python -m dataset_prep amazon-beauty --download --out {tmp_path}" in message
    yelp = str(not_prepared_error("yelp", str(tmp_path / "yelp")))
    assert f"python -m dataset_prep yelp --download --out {tmp_path} --source one-line" in yelp


@pytest.mark.parametrize(
    "argv, message",
    [
        (["yelp", "--download", "--source", "raw"], "accepting its licence"),
        (["mine", "--download"], "'mine' is not one of them"),
        (["lastfm", "--download", "--raw", "x"], "not both"),
        (["lastfm", "--source", "raw"], "go with --download"),
    ],
)
def test_download_usage_errors_are_one_line(tmp_path, capsys, argv, message):
    try:
        code = main([*argv, "--out", str(tmp_path), "--quiet"])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "downloads").exists()


def test_a_mirror_serves_the_same_bytes(tmp_path, server, monkeypatch):
    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")
    server.files["mirror/LastFM.txt"] = data
    monkeypatch.setitem(
        download.SOURCES,
        ("lastfm", ONE_LINE_SOURCE),
        Source(
            server.url("gone/LastFM.txt"),
            "LastFM.txt",
            "one-line",
            sha256=hashlib.sha256(data).hexdigest(),
        ),
    )
    out = tmp_path / "dataset"
    argv = ["lastfm", "--download", "--source", "one-line", "--out", str(out), "--quiet"]
    assert main([*argv, "--no-check", "--url", server.url("mirror/LastFM.txt")]) == 0
    assert server.requests == [("mirror/LastFM.txt", None)]


def test_a_link_planted_at_the_part_file_is_never_written_through(
    tmp_path, server, monkeypatch, capsys
):
    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")
    out = tmp_path / "dataset"
    (out / "downloads").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    part = out / "downloads" / "LastFM.txt.part"
    part.symlink_to(victim)  # a resumed download would append to it
    command = ["lastfm", "--download", "--source=one-line", f"--out={out}", "--quiet", "--no-check"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a partial download of this program" in err
    assert victim.read_bytes() == b"precious" and server.requests == []
    part.unlink()
    os.link(victim, part)  # a second name of another file: the same
    assert main(command) == 1
    assert victim.read_bytes() == b"precious"


def test_a_link_planted_at_the_extracted_part_file_is_never_written_through(
    tmp_path, server, monkeypatch, capsys
):
    archive, dat = publish_lastfm_archive(monkeypatch, server)
    out = tmp_path / "dataset"
    (out / "downloads").mkdir(parents=True)
    (out / "downloads" / "hetrec2011-lastfm-2k.zip").write_bytes(archive)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (out / "downloads" / "user_taggedartists-timestamps.dat.part").symlink_to(victim)
    assert main(["lastfm", "--download", "--out", str(out), "--quiet", "--no-check"]) == 1
    assert "is not a partial download of this program" in capsys.readouterr().err
    assert victim.read_bytes() == b"precious"
    # A leftover of a killed extraction (a regular file of ours) is simply replaced.
    (out / "downloads" / "user_taggedartists-timestamps.dat.part").unlink()
    (out / "downloads" / "user_taggedartists-timestamps.dat.part").write_bytes(b"half")
    assert main(["lastfm", "--download", "--out", str(out), "--quiet", "--no-check"]) == 0
    assert (out / "downloads" / "user_taggedartists-timestamps.dat").read_bytes() == dat


def test_a_url_that_is_not_a_download_address_is_one_line(tmp_path, capsys):
    out = tmp_path / "dataset"
    assert main(["lastfm", "--download", "--url", "notaurl", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--url 'notaurl' is not a download address" in err
    assert not out.exists()


def test_a_truncated_download_without_length_never_gets_the_published_name(
    tmp_path, server, monkeypatch, capsys
):
    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line",
            sha256=None)  # fmt: skip
    server.no_length.add("LastFM.txt")
    server.cut["LastFM.txt"] = len(data) // 2  # the connection drops; nothing tells
    out = tmp_path / "dataset"
    command = ["lastfm", "--download", "--source=one-line", f"--out={out}", "--quiet"]
    assert main(command) == 2  # the published counts refuse it
    err = capsys.readouterr().err
    part = out / "downloads" / "LastFM.txt.part"
    assert f"the downloaded file is {part}: delete it to download again" in err
    assert not (out / "downloads" / "LastFM.txt").exists()
    # Accepted on request (--no-check): only then does it take the published name.
    part.unlink()
    assert main([*command, "--no-check"]) == 0
    assert (out / "downloads" / "LastFM.txt").read_bytes() == data and not part.exists()


def test_a_full_disk_during_a_download_is_an_error_not_a_shorter_file(
    tmp_path, server, monkeypatch, capsys
):
    import errno

    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line",
            sha256=None)  # fmt: skip
    original = download._open_part

    class FullDisk:
        def __init__(self, handle):
            self.handle, self.written = handle, 0

        def write(self, block):
            if self.written + len(block) > 100:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(block)
            return self.handle.write(block)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

    monkeypatch.setattr(
        download, "_open_part", lambda part, append: FullDisk(original(part, append))
    )
    out = tmp_path / "dataset"
    command = ["lastfm", "--download", "--source=one-line", f"--out={out}", "--quiet", "--no-check"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err
    assert not (out / "downloads" / "LastFM.txt").exists() and not (out / "lastfm").exists()


def test_a_server_that_trickles_is_given_up_with_the_part_kept(
    tmp_path, server, monkeypatch, capsys
):
    data = one_line_fixture(tmp_path)[:400]
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")
    server.slow["LastFM.txt"] = 0.02
    monkeypatch.setattr(download, "STALL_SECONDS", 0.5)
    monkeypatch.setattr(download, "STALL_BYTES", 1000)
    out = tmp_path / "dataset"
    command = ["lastfm", "--download", "--source=one-line", f"--out={out}", "--quiet"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "bytes in the last 0.5 s (at least 1,000 are expected)" in err
    assert "run the same command again to resume" in err
    assert (out / "downloads" / "LastFM.txt.part").stat().st_size > 0


def test_ctrl_c_before_any_byte_says_nothing_was_downloaded(tmp_path, server, monkeypatch, capsys):
    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(download.urllib.request, "urlopen", interrupted)
    out = tmp_path / "dataset"
    assert main(["lastfm", "--download", "--source=one-line", f"--out={out}", "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "nothing was downloaded yet" in err and "is kept" not in err


def test_a_wrong_archive_from_a_mirror_names_the_files_to_delete(
    tmp_path, server, monkeypatch, capsys
):
    publish_lastfm_archive(monkeypatch, server, sha256=None)
    out = tmp_path / "dataset"
    assert main(["lastfm", "--download", "--out", str(out), "--quiet"]) == 2  # counts differ
    err = capsys.readouterr().err
    downloads = out / "downloads"
    assert (
        f"the downloaded files are {downloads / 'hetrec2011-lastfm-2k.zip'} and "
        f"{downloads / 'user_taggedartists-timestamps.dat'}: delete them to download again"
    ) in err


def damaged_archive(data: bytes, damage: str) -> bytes:
    """``data`` zipped with one member, then damaged as archives from a bad mirror are:
    deflate data overwritten, an unknown compression method, or the encryption bit."""
    import struct

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("user_taggedartists-timestamps.dat", data)
    raw = bytearray(buffer.getvalue())
    local, central = raw.find(b"PK\x03\x04"), raw.find(b"PK\x01\x02")
    if damage == "deflate":
        name_length, extra_length = struct.unpack_from("<HH", raw, local + 26)
        start = local + 30 + name_length + extra_length
        raw[start : start + 16] = b"\xff" * 16
    elif damage == "method":
        struct.pack_into("<H", raw, local + 8, 99)
        struct.pack_into("<H", raw, central + 10, 99)
    else:
        for offset in (local + 6, central + 8):
            struct.pack_into("<H", raw, offset, struct.unpack_from("<H", raw, offset)[0] | 1)
    return bytes(raw)


@pytest.mark.parametrize(
    "damage, raised",
    [("deflate", "error"), ("method", "NotImplementedError"), ("encrypted", "RuntimeError")],
)
def test_a_damaged_archive_is_one_line_and_never_kept_under_its_name(
    tmp_path, server, monkeypatch, capsys, damage, raised
):
    good, dat = lastfm_archive()
    name = "hetrec2011-lastfm-2k.zip"
    publish_lastfm_archive(monkeypatch, server, sha256=None)
    server.files[name] = damaged_archive(dat, damage)
    out = tmp_path / "dataset"
    command = ["lastfm", "--download", "--out", str(out), "--quiet", "--no-check"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"is not a usable archive ({raised}" in err and err.count("\n") == 1, err
    downloads = out / "downloads"
    assert not (downloads / name).exists() and (downloads / f"{name}.damaged").exists()
    assert not list(downloads.glob("*.part")) and not (out / "lastfm").exists()
    # A good archive (from a mirror, or the server mended): the rerun fetches it again.
    server.files[name] = good
    assert main(command) == 0
    assert (downloads / name).read_bytes() == good


def test_two_downloads_into_one_folder_never_share_a_part_file(
    tmp_path, server, monkeypatch, capsys
):
    from dataset_prep.atomic import lock_folder

    data = one_line_fixture(tmp_path)
    publish(monkeypatch, server, "lastfm", ONE_LINE_SOURCE, "LastFM.txt", data, "one-line")
    out = tmp_path / "dataset"
    downloads = out / "downloads"
    downloads.mkdir(parents=True)
    command = ["lastfm", "--download", "--source", "one-line", "--out", str(out), "--quiet"]
    held = lock_folder(downloads, "busy")  # another download in progress
    try:
        assert main([*command, "--no-check"]) == 2
    finally:
        os.close(held)
    err = capsys.readouterr().err
    assert f"another dataset_prep is downloading into {downloads} right now" in err
    assert list(downloads.iterdir()) == [] and server.requests == []
    assert main([*command, "--no-check"]) == 0
    assert (downloads / "LastFM.txt").read_bytes() == data


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://[::1", "--url 'http://[::1' is not a valid address (Invalid IPv6 URL)"),
        ("http://host:port/x", "--url 'http://host:port/x' is not a valid address"),
        ("ftp//user:hunter2@mirror/x", "--url 'ftp//user:***@mirror/x' is not a download"),
    ],
)
def test_bad_urls_are_one_line_and_never_echo_a_password(tmp_path, capsys, url, shown):
    out = tmp_path / "dataset"
    assert main(["lastfm", "--download", "--url", url, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert shown in err and "hunter2" not in err and err.count("\n") == 1
    assert not out.exists()
