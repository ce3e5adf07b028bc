"""Reading parallel corpora: formats, alignment checks and the errors users see."""

import gzip

import pytest

from minitfm.data import DataError, read_lines, read_parallel, read_parallel_files, read_sgm
from minitfm.data.corpus import ParallelReader, unescape_xml


def write(path, data: bytes, compress: bool = False):
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def test_plain_and_gzipped_sides(tmp_path):
    write(tmp_path / "train.en", b"a house\nthe cat\n")
    write(tmp_path / "train.de.gz", "ein Haus\ndie Katze\n".encode(), compress=True)
    text = read_parallel(tmp_path / "train", "en", "de")
    assert text.src == ["a house", "the cat"]
    assert text.tgt == ["ein Haus", "die Katze"]
    assert list(text.pairs()) == [("a house", "ein Haus"), ("the cat", "die Katze")]
    assert len(text) == 2 and text.skipped_invalid == 0


def test_gzip_is_detected_from_content_not_name(tmp_path):
    path = write(tmp_path / "x.en", "gzipped näive\n".encode(), compress=True)
    assert read_lines(path) == ["gzipped näive"]


def test_line_endings_bom_and_unicode_separators(tmp_path):
    # CRLF endings, a BOM, and U+2028 inside a line (which str.splitlines would split on)
    path = write(tmp_path / "x.en", b"\xef\xbb\xbfone\r\ntwo \xe2\x80\xa8 still two\r\nlast")
    assert read_lines(path) == ["one", "two \u2028 still two", "last"]


def test_missing_side_names_what_was_looked_for(tmp_path):
    write(tmp_path / "train.en", b"a\n")
    with pytest.raises(DataError) as err:
        read_parallel(tmp_path / "train", "en", "de")
    message = str(err.value)
    assert "'de'" in message and "train.de," in message and "train.de.gz" in message


def test_both_plain_and_gzipped_present_is_ambiguous(tmp_path):
    write(tmp_path / "t.en", b"a\n")
    write(tmp_path / "t.en.gz", b"a\n", compress=True)
    write(tmp_path / "t.de", b"b\n")
    with pytest.raises(DataError, match="both"):
        read_parallel(tmp_path / "t", "en", "de")


def test_unreadable_file_is_named(tmp_path):
    (tmp_path / "t.en").mkdir()
    write(tmp_path / "t.de", b"b\n")
    with pytest.raises(DataError, match="t.en"):
        read_parallel_files(tmp_path / "t.en", tmp_path / "t.de")


@pytest.mark.parametrize("src_lines, tgt_lines", [(3, 2), (2, 5)])
def test_line_count_mismatch_names_both_files_and_counts(tmp_path, src_lines, tgt_lines):
    src = write(tmp_path / "c.en", b"x\n" * src_lines)
    tgt = write(tmp_path / "c.de.gz", b"y\n" * tgt_lines, compress=True)
    with pytest.raises(DataError) as err:
        read_parallel(tmp_path / "c", "en", "de")
    message = str(err.value)
    assert f"{src} has {src_lines} lines" in message and f"{tgt} has {tgt_lines}" in message


def test_streaming_reader_raises_after_the_last_pair(tmp_path):
    write(tmp_path / "c.en", b"1\n2\n3\n")
    write(tmp_path / "c.de", b"1\n2\n")
    seen = []
    with pytest.raises(DataError, match="3 lines"):
        for pair in ParallelReader(tmp_path / "c.en", tmp_path / "c.de"):
            seen.append(pair)
    assert seen == [("1", "1"), ("2", "2")]


def test_invalid_utf8_names_file_and_line(tmp_path):
    write(tmp_path / "c.en", b"ok\nfine\n")
    write(tmp_path / "c.de", b"gut\nkaputt \xff\n")
    with pytest.raises(DataError) as err:
        read_parallel(tmp_path / "c", "en", "de")
    assert "c.de, line 2" in str(err.value) and "iconv -f WINDOWS-1252" in str(err.value)


def test_skip_invalid_drops_the_pair_from_both_sides(tmp_path):
    write(tmp_path / "c.en", b"one\n\xc3(two\nthree\nfour\n")
    write(tmp_path / "c.de", b"eins\nzwei\ndrei \xe2\x82\nvier\n")
    text = read_parallel(tmp_path / "c", "en", "de", skip_invalid=True)
    assert text.src == ["one", "four"] and text.tgt == ["eins", "vier"]
    assert text.skipped_invalid == 2


def test_truncated_gzip_is_an_error(tmp_path):
    data = gzip.compress(b"line\n" * 1000)
    write(tmp_path / "c.en", data[: len(data) // 2])
    with pytest.raises(DataError, match="corrupt or truncated"):
        read_lines(tmp_path / "c.en")


SRC_SGM = """<srcset setid="newstest2014" srclang="any">
<doc docid="d1" genre="news" origlang="en">
<seg id="1">Fish &amp; chips &lt;3</seg>
<seg id="2">  spaced   out  </seg>
</doc>
<doc docid="d2" genre="news" origlang="de">
<seg id=1>&amp;lt; is literal, &#228; &#xE9; &nbsp; stays</seg>
</doc>
</srcset>
"""
REF_SGM = """<refset trglang="de" setid="newstest2014" srclang="any">
<doc sysid="ref" docid="d1" genre="news" origlang="en">
<seg id="1">Fisch &amp; Pommes</seg>
<seg id="2">weit</seg>
</doc>
<doc sysid="ref" docid="d2" genre="news" origlang="de">
<seg id="1">drei</seg>
</doc>
</refset>
"""


def test_sgml_segments_entities_and_whitespace(tmp_path):
    path = write(tmp_path / "t-src.en.sgm", SRC_SGM.encode())
    assert read_sgm(path) == ["Fish & chips <3", "spaced out",
                              "&lt; is literal, ä é &nbsp; stays"]


def test_sgml_parallel_pairs_by_document_and_segment(tmp_path):
    src = write(tmp_path / "t-src.en.sgm", SRC_SGM.encode())
    ref = write(tmp_path / "t-ref.de.sgm.gz", REF_SGM.encode(), compress=True)
    text = read_parallel_files(src, ref)
    assert text.tgt == ["Fisch & Pommes", "weit", "drei"] and len(text.src) == 3


def test_sgml_with_different_segment_ids_is_misaligned(tmp_path):
    src = write(tmp_path / "s.en.sgm", SRC_SGM.encode())
    ref = write(tmp_path / "r.de.sgm", REF_SGM.replace('docid="d2"', 'docid="d3"').encode())
    with pytest.raises(DataError, match="segment 3 is doc 'd2'"):
        read_parallel_files(src, ref)


def test_sgml_with_different_segment_counts(tmp_path):
    src = write(tmp_path / "s.en.sgm", SRC_SGM.encode())
    ref = write(tmp_path / "r.de.sgm", REF_SGM.replace('<seg id="2">weit</seg>\n', "").encode())
    with pytest.raises(DataError, match="3 segments.*has 2"):
        read_parallel_files(src, ref)


def test_sgml_malformed_segment_names_the_line(tmp_path):
    path = write(tmp_path / "s.en.sgm", b'<doc docid="d">\n<seg id="1">no end tag\n</doc>\n')
    with pytest.raises(DataError, match="s.en.sgm, line 2: malformed"):
        read_sgm(path)


def test_mixing_sgml_and_plain_is_refused(tmp_path):
    src = write(tmp_path / "s.en.sgm", SRC_SGM.encode())
    ref = write(tmp_path / "r.de", b"a\nb\nc\n")
    with pytest.raises(DataError, match="SGML"):
        read_parallel_files(src, ref)


def test_unescape_is_a_single_pass():
    assert unescape_xml("&amp;amp; &quot;&apos; &#0; &#x110000;") == "&amp; \"' &#0; &#x110000;"
