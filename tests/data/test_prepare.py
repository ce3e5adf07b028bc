"""WMT14 preparation from small fake archives served from file:// (and a local HTTP server)."""

import hashlib
import http.server
import io
import tarfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from minitfm.data import DataError, read_lines
from minitfm.data.prepare import ARCHIVES, BASE_URL_ENV, Archive, download, prepare_wmt14

EN = ["Resumption of the session", "I declare resumed the session .", "Thank you ."]
DE = ["Wiederaufnahme der Sitzungsperiode", "Ich erkläre die Sitzung für eröffnet .", "Danke ."]


def sgm(kind: str, lang: str, lines: list[str]) -> str:
    segs = "".join(f'<seg id="{i}">{text}</seg>\n' for i, text in enumerate(lines, start=1))
    return (f'<{kind}set setid="newstest2014">\n<doc docid="d" genre="news">\n'
            f'{segs}</doc>\n</{kind}set>\n')


# member name -> content, per archive, with the released archives' member names
FAKE_MEMBERS = {
    "training-parallel-europarl-v7.tgz": {
        "training/europarl-v7.de-en.en": "\n".join(EN) + "\n",
        "training/europarl-v7.de-en.de": "\n".join(DE) + "\n",
        "training/europarl-v7.fr-en.fr": "Reprise de la session\n",
    },
    "training-parallel-commoncrawl.tgz": {
        # an empty line, a badly proportioned pair and invalid UTF-8 for cleaning to catch
        "commoncrawl.de-en.en":
            "a crawled line\n\none two three four five six seven eight nine ten\nbad\n",
        "commoncrawl.de-en.de": "eine Zeile\nleer\neins\nkaputt \udcff\n",
        "commoncrawl.de-en.annotation": "x\n",
    },
    "training-parallel-nc-v9.tgz": {
        "training/news-commentary-v9.de-en.en": "Gold costs &amp; more\n",
        "training/news-commentary-v9.de-en.de": "Gold kostet mehr\n",
    },
    "dev.tgz": {
        "dev/newstest2013.en": "A dev sentence .\nAnother one .\n",
        "dev/newstest2013.de": "Ein Satz .\nNoch einer .\n",
        "dev/newstest2013-src.en.sgm": sgm("src", "en", ["unused"]),
    },
    "test-full.tgz": {
        "test-full/newstest2014-deen-src.en.sgm": sgm("src", "en", ["Fish &amp; chips", "Hello"]),
        "test-full/newstest2014-deen-ref.de.sgm": sgm("ref", "de", ["Fisch &amp; Pommes", "Hallo"]),
        "test-full/newstest2014-deen-src.de.sgm": sgm("src", "de", ["Guten Tag", "Tschüss"]),
        "test-full/newstest2014-deen-ref.en.sgm": sgm("ref", "en", ["Good day", "Bye"]),
    },
}


def make_tar(path: Path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def mirror(tmp_path) -> tuple[str, dict[str, Archive]]:
    """A directory of fake archives, its file:// URL, and an archive table with their checksums."""
    root = tmp_path / "mirror"
    root.mkdir()
    archives = {}
    for key, archive in ARCHIVES.items():
        make_tar(root / archive.filename, FAKE_MEMBERS[archive.filename])
        data = (root / archive.filename).read_bytes()
        archives[key] = replace(archive, size=len(data),
                                checksum="sha256:" + hashlib.sha256(data).hexdigest())
    return root.as_uri(), archives


def test_the_table_names_the_papers_archives():
    assert {a.filename for a in ARCHIVES.values()} == set(FAKE_MEMBERS)
    assert all(a.url.startswith("https://www.statmt.org/wmt1") for a in ARCHIVES.values())


def test_full_preparation(tmp_path, mirror):
    base_url, archives = mirror
    out = tmp_path / "wmt14"
    summary = prepare_wmt14(out, base_url=base_url, archives=archives, progress=False)
    assert read_lines(out / "train.en") == EN + ["a crawled line", "Gold costs &amp; more"]
    assert read_lines(out / "train.de") == DE + ["eine Zeile", "Gold kostet mehr"]
    assert read_lines(out / "valid.en") == ["A dev sentence .", "Another one ."]
    assert read_lines(out / "test.en") == ["Fish & chips", "Hello"]
    assert read_lines(out / "test.de") == ["Fisch & Pommes", "Hallo"]
    train = summary["train"]
    assert train["corpora"]["commoncrawl.de-en"] == {"read": 4, "skipped_invalid": 1}
    assert train["clean"]["kept"] == 5
    assert train["clean"]["dropped"]["empty"] == 1 and train["clean"]["dropped"]["ratio"] == 1
    assert summary["test"]["pairs"] == 2 and summary["valid"]["pairs"] == 2
    assert sorted(p.name for p in (out / "downloads").iterdir()) == sorted(FAKE_MEMBERS)
    assert not list(out.rglob("*.tmp")) and not list(out.rglob("*.part"))
    # a second call finds everything done and downloads nothing
    for path in (out / "downloads").iterdir():
        path.unlink()
    assert prepare_wmt14(out, base_url=base_url, archives=archives, progress=False) == summary
    # other cleaning options: the training text is re-assembled from the extracted files
    unclean = prepare_wmt14(out, base_url=base_url, archives=archives, clean=None, progress=False)
    assert unclean["train"]["clean"] is None and len(read_lines(out / "train.en")) == 7


def test_a_summary_cut_short_is_said_and_the_preparation_made_again(tmp_path, mirror, capsys):
    base_url, archives = mirror
    out = tmp_path / "wmt14"
    summary = prepare_wmt14(out, base_url=base_url, archives=archives, progress=False)
    (out / "prepare.json").write_text('{"languages": ["en", "de"], "fil')
    assert prepare_wmt14(out, base_url=base_url, archives=archives, progress=False) == summary
    assert f"{out / 'prepare.json'} cannot be read (" in capsys.readouterr().err


def test_reverse_direction_uses_the_other_test_files(tmp_path, mirror, monkeypatch):
    base_url, archives = mirror
    monkeypatch.setenv(BASE_URL_ENV, base_url)
    out = tmp_path / "wmt14"
    prepare_wmt14(out, src_lang="de", tgt_lang="en", archives=archives, progress=False)
    assert read_lines(out / "test.de") == ["Guten Tag", "Tschüss"]
    assert read_lines(out / "test.en") == ["Good day", "Bye"]
    with pytest.raises(DataError, match="English-German"):
        prepare_wmt14(out, src_lang="en", tgt_lang="fr", archives=archives)


def test_resume_of_a_partial_file_download(tmp_path, mirror):
    base_url, archives = mirror
    archive = archives["europarl"]
    data = Path(base_url.removeprefix("file://"), archive.filename).read_bytes()
    dest = tmp_path / "dl" / archive.filename
    dest.parent.mkdir()
    part = dest.with_name(dest.name + ".part")
    part.write_bytes(data[:100])
    download(f"{base_url}/{archive.filename}", dest, size=archive.size, checksum=archive.checksum,
             progress=False)
    assert dest.read_bytes() == data and not part.exists()


def test_checksum_mismatch_is_clear_and_keeps_nothing(tmp_path, mirror):
    base_url, archives = mirror
    archive = replace(archives["dev"], checksum="sha256:" + "0" * 64)
    dest = tmp_path / "dl" / archive.filename
    with pytest.raises(DataError) as err:
        download(f"{base_url}/{archive.filename}", dest, size=archive.size,
                 checksum=archive.checksum, progress=False)
    assert "checksum mismatch" in str(err.value) and "0" * 64 in str(err.value)
    assert list(dest.parent.iterdir()) == []


def test_corrupt_partial_download_is_caught_and_removed(tmp_path, mirror):
    base_url, archives = mirror
    archive = archives["dev"]
    dest = tmp_path / "dl" / archive.filename
    dest.parent.mkdir()
    dest.with_name(dest.name + ".part").write_bytes(b"garbage!")  # resumed from a wrong start
    with pytest.raises(DataError, match="checksum mismatch"):
        download(f"{base_url}/{archive.filename}", dest, size=archive.size,
                 checksum=archive.checksum, progress=False)
    assert list(dest.parent.iterdir()) == []
    download(f"{base_url}/{archive.filename}", dest, size=archive.size,
             checksum=archive.checksum, progress=False)
    assert dest.is_file()


def test_wrong_size_and_missing_source(tmp_path, mirror):
    base_url, archives = mirror
    archive = archives["dev"]
    with pytest.raises(DataError, match=f"{archive.size} bytes but 10 were expected"):
        download(f"{base_url}/{archive.filename}", tmp_path / "a.tgz", size=10, progress=False)
    with pytest.raises(DataError, match="cannot download .*nothing.tgz"):
        download(f"{base_url}/nothing.tgz", tmp_path / "b.tgz", progress=False)
    assert not list(tmp_path.glob("*.tgz*"))


def test_path_traversal_member_is_rejected(tmp_path, mirror):
    base_url, archives = mirror
    root = Path(base_url.removeprefix("file://"))
    members = dict(FAKE_MEMBERS["dev.tgz"], **{"../../newstest2013.en": "evil\n"})
    make_tar(root / "dev.tgz", members)
    archives = {key: replace(a, size=None, checksum=None) for key, a in archives.items()}
    out = tmp_path / "wmt14"
    with pytest.raises(DataError, match=r"unsafe member '\.\./\.\./newstest2013\.en'"):
        prepare_wmt14(out, base_url=base_url, archives=archives, progress=False)
    assert not (tmp_path / "newstest2013.en").exists() and not (out / "valid.en").exists()


def test_link_member_is_rejected(tmp_path, mirror):
    base_url, archives = mirror
    root = Path(base_url.removeprefix("file://"))
    with tarfile.open(root / "test-full.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("test-full/newstest2014-deen-src.en.sgm")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    archives = {key: replace(a, size=None, checksum=None) for key, a in archives.items()}
    with pytest.raises(DataError, match="not a regular file"):
        prepare_wmt14(tmp_path / "wmt14", base_url=base_url, archives=archives, progress=False)


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves one payload; honours ``Range: bytes=N-`` unless ``ignore_range`` is set."""

    payload = b""
    ignore_range = False
    requests: list = []

    def do_GET(self):
        header = self.headers.get("Range")
        type(self).requests.append(header)
        start = int(header[len("bytes="):-1]) if header and not self.ignore_range else 0
        body = self.payload[start:]
        self.send_response(206 if start else 200)
        if start:
            size = len(self.payload)
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("ignore_range", [False, True])
def test_http_resume_with_range_requests(tmp_path, ignore_range):
    payload = bytes(range(256)) * 40
    handler = type("Handler", (RangeHandler,), {"payload": payload, "ignore_range": ignore_range,
                                                "requests": []})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        dest = tmp_path / "file.bin"
        dest.with_name("file.bin.part").write_bytes(payload[:1000])
        url = f"http://127.0.0.1:{server.server_port}/file.bin"
        download(url, dest, checksum="md5:" + hashlib.md5(payload).hexdigest(), progress=False)
    finally:
        server.shutdown()
        server.server_close()
    assert dest.read_bytes() == payload
    assert handler.requests == ["bytes=1000-"]
