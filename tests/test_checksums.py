"""formats/checksums.py: the registry's digests are the published ones, and
streamed digests equal one-shot digests across chunk boundaries."""

from __future__ import annotations

import pytest

from iekit.formats import checksums
from iekit.formats.errors import FormatError

# Published vectors: XXH3_128bits("") from xxHash's sanity tests (seed 0,
# canonical big-endian form: high 64 bits first); SHA-256("abc") from FIPS 180-2.
VECTORS = [("xxh3_128", b"", "99aa06d3014798d86001c324468d497f"),
           ("sha256", b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")]


@pytest.mark.parametrize("alg,data,want", VECTORS)
def test_published_vectors(alg, data, want):
    assert checksums.digest(alg, data) == want
    assert checksums.ALGORITHMS[alg].check(want)
    assert len(want) == checksums.ALGORITHMS[alg].hex_digits


@pytest.mark.parametrize("alg", checksums.NAMES)
def test_streamed_range_equals_one_shot(tmp_path, alg, monkeypatch):
    import iekit.formats.fileio as fileio

    data = bytes(range(256)) * 41 + b"tail"
    p = tmp_path / "f"
    p.write_bytes(b"head" + data + b"after")
    monkeypatch.setattr(fileio.pread_views, "__defaults__", (1000,))  # many chunks, the last one partial
    seen = []
    assert checksums.digest_file_range(p, 4, len(data), alg, seen.append) == checksums.digest(alg, data)
    assert seen == [1000] * (len(data) // 1000) + [len(data) % 1000]
    assert checksums.digest_file_range(p, 4, 0, alg) == checksums.digest(alg, b"")
    with pytest.raises(FormatError) as ei:  # a range past the end: the file's one clear error
        checksums.digest_file_range(p, 4, len(data) + 6, alg)
    assert ei.value.field == "(size)" and str(p) in str(ei.value) and "ends before byte" in str(ei.value)


@pytest.mark.parametrize("value", ["md5", "SHA256", "", None, 1, ["sha256"]])
def test_unknown_algorithms_are_one_clear_error(value):
    with pytest.raises(FormatError) as ei:
        checksums.algorithm(value, "m.json")
    assert ei.value.field == "checksum" and "unsupported checksum algorithm" in str(ei.value)


def test_a_record_must_carry_its_files_algorithm_only():
    alg = checksums.ALGORITHMS["xxh3_128"]
    good = {"name": "a", "xxh3_128": "0" * 32}
    checksums.check_record(good, alg, "m.json", "files[0]")
    for rec, field, words in [({"name": "a"}, "files[0]", "missing key 'xxh3_128'"),
                              ({"xxh3_128": "0" * 31}, "files[0].xxh3_128", "32 lowercase hex"),
                              ({**good, "sha256": "0" * 64}, "files[0].sha256", "whose checksum is 'xxh3_128'")]:
        with pytest.raises(FormatError) as ei:
            checksums.check_record(rec, alg, "m.json", "files[0]")
        assert ei.value.field == field and words in str(ei.value)
