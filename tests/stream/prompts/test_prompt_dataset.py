"""A dataset that cannot be read is one `DatasetError` naming the path and what is wrong, never a raw
JSONDecodeError or ArrowInvalid (stream/prompts/dataset.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_stream.errors import ConfigurationError
from rollout_stream.prompts import DatasetError, fingerprint, load_rows


def saved(tmp_path: Path, rows: list[dict[str, object]], **options: object) -> Path:
    import datasets

    path = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(path), **options)  # type: ignore[arg-type]
    return path


def test_a_byte_order_mark_at_the_start_is_skipped_and_one_inside_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"q": 1}\n{"q": 2}\n')  # as Windows tools save "UTF-8"
    assert load_rows(path) == [{"q": 1}, {"q": 2}]
    path.write_bytes(b'{"q": 1}\n\xef\xbb\xbf{"q": 2}\n')  # two such files concatenated
    with pytest.raises(DatasetError, match=f"dataset {path} line 2: starts with a UTF-8 byte order mark"):
        load_rows(path)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_named_as_what_json_lacks(tmp_path: Path, value: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(f'{{"q": 1}}\n{{"q": 2, "score": {value}}}\n')  # the value at byte 18
    where = rf"dataset {path} line 2: .*\(byte 1[89]\)"  # where msgspec stopped: 19 after a minus sign
    with pytest.raises(DatasetError, match=where + ": NaN or Infinity is not JSON"):
        load_rows(path)


def test_a_corrupt_state_json_is_named(tmp_path: Path) -> None:
    path = saved(tmp_path, [{"q": 1}])
    (path / "state.json").write_text("{not json")
    with pytest.raises(DatasetError, match=f"dataset {path}: state.json is not the state.json datasets"):
        load_rows(path)
    (path / "state.json").write_text('{"_data_files": [{"filename": "gone.arrow"}]}')
    with pytest.raises(DatasetError, match="state.json lists files that are not there: gone.arrow"):
        load_rows(path)


def test_a_corrupt_arrow_file_is_named(tmp_path: Path) -> None:
    path = saved(tmp_path, [{"q": 1}])
    [arrow] = path.glob("*.arrow")
    arrow.write_bytes(b"\x00" * 64)
    with pytest.raises(DatasetError, match=f"dataset {arrow}: not readable as an Arrow file"):
        load_rows(path)


def test_an_arrow_file_in_the_random_access_format_is_read(tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.table({"q": [1, 2]})
    directory = tmp_path / "files"
    directory.mkdir()
    with pa.ipc.new_file(directory / "data.arrow", table.schema) as w:
        w.write_table(table)
    assert load_rows(directory) == [{"q": 1}, {"q": 2}]


def test_a_corrupt_parquet_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match=f"dataset {path}: not readable as a Parquet file"):
        load_rows(path)


def test_a_dataset_dict_is_told_to_give_one_split(tmp_path: Path) -> None:
    import datasets

    path = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"q": 1}]),
                          "test": datasets.Dataset.from_list([{"q": 2}])}).save_to_disk(str(path))
    with pytest.raises(DatasetError, match=f"a DatasetDict .*give one split: {path / 'train'}, "
                                           f"{path / 'test'}"):
        load_rows(path)
    assert load_rows(path / "train") == [{"q": 1}]


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.mkdir()  # a directory named like a file: no .arrow inside
    with pytest.raises(DatasetError, match=f"dataset {path}: a directory without .arrow files"):
        load_rows(path)


def test_dataset_errors_are_configuration_errors_of_one_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": NaN}\n')
    with pytest.raises(ConfigurationError) as caught:
        load_rows(path)
    assert "\n" not in str(caught.value)


def test_the_fingerprint_of_a_file_with_a_byte_order_mark_is_that_of_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"q": 1}\n')
    assert fingerprint(load_rows(path)) == fingerprint([{"q": 1}])
