"""Resources are not data: running out of memory, disk, file handles or a service is named as what it is, and never
lists a file in skipped.csv or marks it bad in a cache."""
import errno
import logging

import pytest

from tf_harness.data.integrity import reading, resources, unreadable, verification


@pytest.mark.parametrize("error, what", [
    (MemoryError(), "memory"),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), "memory"),
    (OSError(errno.ENOSPC, "No space left on device"), "disk space"),
    (OSError(errno.EFBIG, "File too large"), "room under the file size limit (ulimit -f)"),
    (OSError(errno.EMFILE, "Too many open files"), "file handles"),
    (OSError(errno.ENFILE, "Too many open files in system"), "file handles (the whole system's)"),
])
def test_each_want_of_a_resource_is_named(error, what):
    assert resources.exhausted(error) == what
    with pytest.raises(resources.OutOfResource, match=rf"^out of {what.split(' (')[0]}"):
        resources.raise_if_exhausted(error)


def test_tensorflows_resource_errors_are_named_and_its_data_errors_are_not():
    import tensorflow as tf

    assert resources.exhausted(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")) == "memory"
    assert resources.exhausted(tf.errors.UnavailableError(None, None, "Socket closed")) == "a service (unavailable)"
    assert resources.exhausted(tf.errors.UnknownError(None, None, "/x.jpg; Too many open files")) == "file handles"
    assert resources.exhausted(tf.errors.InvalidArgumentError(None, None, "Invalid PNG data, size 4")) is None
    assert resources.exhausted(OSError(errno.EIO, "Input/output error")) is None  # a bad disk block is the file's
    resources.raise_if_exhausted(ValueError("not JSON"))  # nothing to say


def test_out_of_file_handles_while_checking_an_image_is_no_verdict_and_nothing_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    image = tmp_path / "a.jpg"
    image.write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 100 + b"\xff\xd9")

    def no_handles(path, mode="rb", **kwargs):
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    with monkeypatch.context() as patched:
        patched.setattr(reading, "open_file", no_handles)
        with pytest.raises(resources.OutOfResource, match="out of file handles"):
            verification.problem(str(image))
        with pytest.raises(resources.OutOfResource):
            verification.check_files([str(image)])
    assert verification.check_files([str(image)]) == ({}, 1)  # judged afresh, and whole, once handles are back


def _report(folder, *paths):
    """A report file as `unreadable.guard` writes it: the paths, named by their hash."""
    import tensorflow as tf

    content = "\n".join(paths).encode()
    name = int(tf.strings.to_hash_bucket_fast(content, 2 ** 62))
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.txt").write_bytes(content)


def _whole_png(path):
    import tensorflow as tf

    path.write_bytes(tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy())
    return str(path)


def test_a_record_that_reads_whole_outside_the_pipeline_is_not_listed_and_the_stop_names_a_resource(tmp_path,
                                                                                                   caplog):
    whole = _whole_png(tmp_path / "whole.png")
    _report(tmp_path / "reports", whole)
    with caplog.at_level(logging.WARNING):
        assert unreadable.collect(tmp_path / "reports", set()) == []
    assert "read and decode whole here" in caplog.text
    error = unreadable.in_a_row_error("230 records in a row failed to read or decode", "in training", "lfw_pairs")
    assert isinstance(error, resources.OutOfResource) and "not a fault of the data" in str(error)


def test_a_damaged_image_is_still_listed_and_the_stop_blames_the_files(tmp_path):
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(b"not an image at all")
    _report(tmp_path / "reports", str(damaged))
    rows = unreadable.collect(tmp_path / "reports", set())
    assert [path for path, _ in rows] == [str(damaged)]
    error = unreadable.in_a_row_error("3 records in a row failed to read or decode", "in training", "lfw_pairs")
    assert not isinstance(error, resources.OutOfResource) and "not what dataset=lfw_pairs reads" in str(error)


def test_running_out_of_memory_decoding_again_on_the_host_lists_nothing(tmp_path, monkeypatch):
    import tensorflow as tf

    whole = _whole_png(tmp_path / "whole.png")
    _report(tmp_path / "reports", whole)

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[20000,20000,3]")

    monkeypatch.setattr(tf.io, "decode_image", out_of_memory)
    with pytest.raises(resources.OutOfResource, match="out of memory"):
        unreadable.collect(tmp_path / "reports", set())
